"""What an agent reads of a tool is its description and its parameters' descriptions, nothing
else: every parameter of every tool the MCP server lists says what it is (its unit, its
limits, an example), and the limits of uart_exchange's ``until`` are kept."""

import pytest
from mcp.client.client import Client

from device_loop.coordinator.calls import TOOLS
from device_loop.coordinator.mcp_tools import build_mcp
from device_loop.coordinator.schemas import UartExchangeIn

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

SHORTEST = 15  # characters: "the device" says too little


async def listed_tools() -> list:
    """The tools as an agent lists them, from the server itself (in memory: no lab needed)."""
    async with Client(build_mcp(None)) as agent:
        return (await agent.list_tools()).tools


async def test_every_tool_and_every_parameter_is_described():
    tools = await listed_tools()
    assert {tool.name for tool in tools} == {name for call in TOOLS for name in (call.name, *call.aliases)}
    undescribed = []
    for tool in tools:
        if len(tool.description or "") < SHORTEST:
            undescribed.append(f"{tool.name}: {tool.description!r}")
        for name, spec in tool.input_schema.get("properties", {}).items():
            said = " ".join((spec.get("description") or "").split())
            if len(said) < SHORTEST:
                undescribed.append(f"{tool.name}({name}): {said!r}")
    assert not undescribed, "what an agent cannot make sense of:\n" + "\n".join(undescribed)


async def test_long_polls_take_wait_s_and_unless_described():
    tools = {tool.name: tool for tool in await listed_tools()}
    for name in ("lease_status", "operation_status", "flash_status"):
        properties = tools[name].input_schema["properties"]
        assert {"wait_s", "unless"} <= set(properties), name
        assert properties["wait_s"]["default"] == 0 and "seconds" in properties["wait_s"]["description"]
        assert "e.g." in properties["unless"]["description"]


async def test_uart_exchange_describes_until():
    (exchange,) = [tool for tool in await listed_tools() if tool.name == "uart_exchange"]
    until = exchange.input_schema["properties"]["until"]
    assert "regular expression" in until["description"] and "e.g." in until["description"]
    assert "until" not in exchange.input_schema.get("required", []), "until is optional"
    assert "until" in (exchange.description or "")


@pytest.mark.parametrize("until, why", [
    ("(unclosed", "missing ), unterminated subpattern"),
    ("a**", "multiple repeat"),
    ("a{4294967296}", "repetition number is too large"),
    ("x" * 501, "at most 500 characters"),
    ("", "at least 1 character"),
])
def test_a_bad_until_is_refused_saying_why(until, why):
    with pytest.raises(ValueError, match="until") as refused:
        UartExchangeIn(lease_id="lease-x", send="\r", until=until)
    assert why in str(refused.value)


def test_a_good_until_is_kept_as_it_was_sent():
    assert UartExchangeIn(lease_id="lease-x", send="\r", until=r"(?m)^login: $").until == r"(?m)^login: $"
    assert UartExchangeIn(lease_id="lease-x", send="\r").until is None
