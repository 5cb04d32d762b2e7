"""Agents through the MCP route, with the SDK's own client, against a coordinator under
uvicorn: the same rules as REST, tools that never block, refusals an agent can act on. One
lab (coordinator, exporter, tokens) for the module: every test gives back what it holds, and
starts with both boards idle."""

import sys
import time
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import SRC, Coordinator, Exporter, lab_tokens, own_environment, sim_devices, wait_for
from device_loop.core import LIVE_LEASE_STATES, __version__
from device_loop.core.holders import listening_ports
from helpers import wait_state

pytestmark = [pytest.mark.service, pytest.mark.anyio, pytest.mark.timeout(120)]


def agent(url: str, token: str | None = None, host: str | None = None) -> Client:
    headers = ({"Authorization": f"Bearer {token}"} if token else {}) | ({"Host": host} if host else {})
    http = httpx2.AsyncClient(headers=headers, timeout=30)
    return Client(streamable_http_client(f"{url}/mcp", http_client=http))


async def call(client: Client, tool: str, **args) -> dict:
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    return result.structured_content


BOARDS = ("sim-board-0", "sim-board-1")


@pytest.fixture(scope="module")
def one_lab(tmp_path_factory):
    """The module's lab with tokens: (its coordinator, {user: token}) for alice and bob."""
    folder = tmp_path_factory.mktemp("mcp-lab")
    environ = own_environment(folder)
    coordinator = Coordinator(folder, environ, extra=("--allowed-host", "lab.example:7420"))
    exporter = None
    try:
        made, token_file = lab_tokens(environ, coordinator, folder, "alice", "bob")
        exporter = Exporter(folder, environ, coordinator.url, sim_devices(*BOARDS), token_file=str(token_file))
        yield coordinator, made
    finally:
        if exporter is not None:
            exporter.stop()
        coordinator.stop()


@pytest.fixture
def lab_with_tokens(one_lab):
    """The module's lab, both boards idle; what a test left held (a failed one) is given back after it."""
    coordinator, made = one_lab
    for name in BOARDS:
        wait_state(coordinator, name, "idle")
    yield coordinator, made
    for token in made.values():
        headers = {"Authorization": f"Bearer {token}"}
        for ticket in coordinator.api("/tickets", headers=headers).json():
            if ticket["state"] == "waiting":
                coordinator.api(f"/tickets/{ticket['ticket']}/cancel", "POST", headers=headers)
        for lease in coordinator.api("/leases", headers=headers).json():
            if lease["state"] in LIVE_LEASE_STATES:
                coordinator.api(f"/leases/{lease['id']}/release", "POST", headers=headers)


async def test_an_agent_reserves_talks_and_releases(lab_with_tokens):
    coordinator, tokens = lab_with_tokens
    async with agent(coordinator.url, tokens["alice"]) as alice:
        assert (alice.server_info.name, alice.server_info.version) == ("device-loop", __version__)
        names = {tool.name for tool in (await alice.list_tools()).tools}
        assert names == {"list_devices", "device_info", "reserve", "lease_status", "lease_cdi", "renew", "release",
                         "device_log", "uart_exchange", "list_images", "flash", "flash_status", "recover",
                         "camera_snapshot", "start_operation", "operation_status", "device_operations",
                         "ticket_status", "claim_ticket", "cancel_ticket", "my_tickets", "settle", "power", "exec", "fingerprint",
                         "submit_job", "job_status", "job_evidence", "whoami", "my_budget", "job_runs", "delete_job"}
        assert (await call(alice, "list_images", device="sim-board-0")) == {"images": []}
        idle = await call(alice, "list_devices", state="idle")
        assert {d["name"] for d in idle["devices"]} == {"sim-board-0", "sim-board-1"}
        negative = await alice.call_tool("reserve", {"device": "sim-board-0", "ttl_s": -5})
        assert negative.is_error and "at least 1 second" in negative.content[0].text
        lease = await call(alice, "reserve", device="sim-board-0", ttl_s=600)
        assert lease["state"] == "pending" and lease["holder"] == "alice"
        again = await alice.call_tool("reserve", {"device": "sim-board-0"})
        assert again.is_error and f"you hold sim-board-0 already: {lease['id']}" in again.content[0].text

        for _ in range(200):  # an agent polls; the tool itself never blocks
            status = await call(alice, "lease_status", lease_id=lease["id"])
            if status["ready"]:
                break
            assert status["reason"]
            await anyio.sleep(0.05)
        assert status["ready"] and status["commands"] == [f"device-loop forward {lease['id']}",
                                                          f"device-loop console {lease['id']}"]
        said = await call(alice, "uart_exchange", lease_id=lease["id"], send="uname\r", wait_s=1)
        assert "Linux sim-board-0" in said["output"] and not said["truncated"]
        ran = await call(alice, "exec", lease_id=lease["id"], command="echo hello; false", timeout_s=20)
        assert ran["stdout"].strip() == "hello" and ran["status"] == 1 and ran["channel"] == "console", ran
        found = await call(alice, "fingerprint", lease_id=lease["id"])
        assert found["device"] == "sim-board-0" and "sim-board-0" in found["kernel"] and found["channel"] == "console"
        assert listening_ports(coordinator.popen.pid) == {coordinator.port}, "a way past the gate was left open"
        renewed = await call(alice, "renew", lease_id=lease["id"], ttl_s=1200)
        assert renewed["expires_at"] > lease["expires_at"]
        assert [e["to"] for e in (await call(alice, "device_log", device="sim-board-0"))["entries"]][-1] == "in_use"

        async with agent(coordinator.url, tokens["bob"]) as bob:
            busy = await bob.call_tool("reserve", {"device": "sim-board-0"})
            assert busy.is_error and "held by alice" in busy.content[0].text and "try sim-board-1" in busy.content[0].text
            stranger = await bob.call_tool("uart_exchange", {"lease_id": lease["id"], "send": "reboot\r"})
            assert stranger.is_error and "unknown lease" in stranger.content[0].text

        released = await call(alice, "release", lease_id=lease["id"])
        assert released["state"] == "released"


PUBLIC_TOOLS = {"list_devices", "device_info", "device_log", "device_operations"}  # as the public board's REST routes


async def test_tools_refuse_callers_without_a_good_token(lab_with_tokens):
    coordinator, tokens = lab_with_tokens
    for token in (None, "dl_forged"):
        async with agent(coordinator.url, token) as nobody:
            for tool in (await nobody.list_tools()).tools:
                args = {name: ("x" if spec.get("type") == "string" else {} if spec.get("type") == "object" else 1)
                        for name, spec in tool.input_schema.get("properties", {}).items()
                        if name in tool.input_schema.get("required", [])}
                answer = await nobody.call_tool(tool.name, args)
                text = answer.content[0].text
                if token is None and tool.name in PUBLIC_TOOLS:
                    assert "needs a token" not in text, f"{tool.name} is public, as its REST route is"
                    continue
                assert answer.is_error, f"{tool.name} answered {token!r}"
                assert "'Authorization: Bearer TOKEN'" in text or "unknown, revoked or expired" in text
        async with agent(coordinator.url, None) as nobody:
            assert "devices" in await call(nobody, "list_devices")


async def test_tools_refuse_what_makes_no_sense(lab_with_tokens):
    coordinator, tokens = lab_with_tokens
    async with agent(coordinator.url, tokens["alice"]) as alice:
        bogus = await alice.call_tool("list_devices", {"state": "bogus"})
        assert bogus.is_error and "no device state is called 'bogus'" in bogus.content[0].text
        huge = await alice.call_tool("uart_exchange", {"lease_id": "lease-x", "send": "x" * 70000})
        assert huge.is_error and "at most 64 KiB" in huge.content[0].text


async def test_unknown_host_header_gets_421_and_a_configured_one_works(lab_with_tokens):
    coordinator, tokens = lab_with_tokens
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Authorization": f"Bearer {tokens['alice']}", "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json", "MCP-Protocol-Version": "2025-06-18"}
    async with httpx2.AsyncClient(timeout=10) as http:
        evil = await http.post(f"{coordinator.url}/mcp", json=body, headers=headers | {"Host": "evil.example"})
        assert evil.status_code == 421
        good = await http.post(f"{coordinator.url}/mcp", json=body, headers=headers | {"Host": "lab.example:7420"})
        assert good.status_code != 421
        # the REST routes too: DNS rebinding, and a web page posting a form at the lab
        rest = await http.get(f"{coordinator.url}/api/v1/devices", headers={"Host": "evil.example"})
        assert rest.status_code == 421 and rest.json()["error"] == "unknown_host"
        forged_form = await http.post(f"{coordinator.url}/api/v1/admin/tokens", content=b'{"user": "mallory"}',
                                      headers={"Origin": "https://evil.example", "Content-Type": "text/plain"})
        assert forged_form.status_code == 403 and forged_form.json()["error"] == "cross_site"
    async with agent(coordinator.url, tokens["alice"], host="lab.example:7420") as alice:
        assert (await call(alice, "list_devices"))["devices"]


async def test_the_readme_s_agent_example_runs_as_it_is(lab_with_tokens, env):
    coordinator, tokens = lab_with_tokens
    example = SRC / "examples" / "mcp_agent.py"  # the README points at it: the text that runs here
    ran = await anyio.run_process([sys.executable, str(example), "sim-board-1"], check=False,
                                  env={**env, "DEVICE_LOOP_COORDINATOR": coordinator.url,
                                       "DEVICE_LOOP_TOKEN": tokens["bob"]})
    said = ran.stdout.decode() + ran.stderr.decode()
    assert ran.returncode == 0, said
    assert "Linux sim-board-1 6.1.0-sim" in said and "released sim-board-1" in said, said
    causes = [e["cause"] for e in coordinator.api("/devices/sim-board-1/log").json()]
    assert any("released by bob" in cause for cause in causes), causes
    wait_for(lambda: coordinator.api("/devices/sim-board-1").json()["state"] == "idle", what="sim-board-1 back")


def test_the_readme_shows_the_example_as_it_is():
    """The README's excerpt of examples/mcp_agent.py is that file's text, line for line."""
    readme = (SRC / "README.md").read_text()
    agents = readme[readme.index("### Agents (MCP)"):]
    excerpt = agents[agents.index("```python\n") + len("```python\n"):]
    excerpt = excerpt[:excerpt.index("```")]
    assert excerpt.strip() and excerpt in (SRC / "examples" / "mcp_agent.py").read_text()


async def ready_lease(client: Client, device: str) -> dict:
    """A lease of ``device``, waited for with lease_status's own long-poll (no polling)."""
    lease = await call(client, "reserve", device=device, ttl_s=600)
    lease = await call(client, "lease_status", lease_id=lease["id"], wait_s=25, unless="pending")
    assert lease["ready"], lease["reason"]
    return lease


async def test_lease_status_waits_for_the_first_change(lab_with_tokens):
    coordinator, tokens = lab_with_tokens
    async with agent(coordinator.url, tokens["alice"]) as alice:
        lease = await ready_lease(alice, "sim-board-0")
        assert lease["state"] == "active"
        began = time.monotonic()
        same = await call(alice, "lease_status", lease_id=lease["id"], wait_s=1)  # unless: the state it has now
        assert same["state"] == "active" and time.monotonic() - began >= 0.9, "it answered before anything changed"

        answers: dict = {}

        async def wait_for_its_end() -> None:
            answers["lease"] = await call(alice, "lease_status", lease_id=lease["id"], wait_s=wait_s, unless="active")
            answers["after_s"] = time.monotonic() - began

        began, wait_s = time.monotonic(), 25
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(wait_for_its_end)
            await call(alice, "release", lease_id=lease["id"])
        assert answers["lease"]["state"] == "released" and answers["after_s"] < wait_s / 2, answers


async def test_uart_exchange_answers_as_soon_as_the_output_matches(lab_with_tokens):
    coordinator, tokens = lab_with_tokens
    async with agent(coordinator.url, tokens["alice"]) as alice:
        lease = await ready_lease(alice, "sim-board-0")
        began = time.monotonic()
        wait_s = 10
        said = await call(alice, "uart_exchange", lease_id=lease["id"], send="help\r", until=r"# $", wait_s=wait_s)
        assert time.monotonic() - began < wait_s / 2, "it waited out wait_s instead of answering at the prompt"
        assert said["matched"] and said["waited_s"] < wait_s / 2 and not said["truncated"]
        assert "commands: help" in said["output"] and said["output"].endswith("sim-board-0:~# "), said

        said = await call(alice, "uart_exchange", lease_id=lease["id"], send="uname\r", until="never printed",
                          wait_s=1)
        assert not said["matched"] and said["waited_s"] >= 1 and "Linux sim-board-0" in said["output"], said
        said = await call(alice, "uart_exchange", lease_id=lease["id"], send="hostname\r", wait_s=0.5)
        assert said["matched"] is False and said["output"].endswith("sim-board-0:~# "), "without until: as before"

        bad = await alice.call_tool("uart_exchange", {"lease_id": lease["id"], "send": "\r", "until": "(unclosed"})
        text = bad.content[0].text
        assert bad.is_error and "until is not a regular expression" in text and "missing )" in text, text
        await call(alice, "release", lease_id=lease["id"])


def searchers_of(pid: int) -> list[int]:
    """The child processes of ``pid`` that search for an exchange's until (relays._SEARCHER)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # it ended meanwhile
        if parent == pid and b"pattern.search" in command:
            found.append(int(stat.parent.name))
    return found


async def test_a_catastrophic_until_costs_its_wait_and_nothing_more(lab_with_tokens):
    coordinator, tokens = lab_with_tokens
    async with agent(coordinator.url, tokens["alice"]) as alice:
        lease = await ready_lease(alice, "sim-board-1")
        began, wait_s = time.monotonic(), 2
        # (a+)+c takes 2**40 steps on 40 a's without a c after them: the search outlasts any wait
        said = await call(alice, "uart_exchange", lease_id=lease["id"], send="echo " + "a" * 40 + "b\r",
                          until=r"(a+)+c", wait_s=wait_s)
        assert time.monotonic() - began < 4 * wait_s, "the search held the exchange up past its wait"
        assert not said["matched"] and "a" * 40 + "b\r\n" in said["output"], said
        assert (await call(alice, "list_devices", state="in_use"))["devices"], "the coordinator answers"
        assert searchers_of(coordinator.popen.pid) == [], "the search outlived its exchange"
        await call(alice, "release", lease_id=lease["id"])


async def test_an_agent_queues_on_a_class_polls_its_ticket_and_gets_the_lease(lab_with_tokens):
    """An agent's tool call never waits: reserve by class with queue answers a batch ticket at
    once while both boards are held; claim_ticket(wait_s) answers at its grant, claimed, with the
    lease (ticket_status reads it and claims nothing)."""
    coordinator, tokens = lab_with_tokens
    async with agent(coordinator.url, tokens["alice"]) as alice, agent(coordinator.url, tokens["bob"]) as bob:
        held = [await call(alice, "reserve", device=name) for name in ("sim-board-0", "sim-board-1")]
        ticket = await call(bob, "reserve", device_class="sim-board", queue=True)
        assert (ticket["state"], ticket["kind"], ticket["position"]) == ("waiting", "batch", 1), ticket
        waiting = await call(bob, "ticket_status", ticket_id=ticket["ticket"], wait_s=0)
        assert waiting["state"] == "waiting" and waiting["lease"] is None
        await call(alice, "release", lease_id=held[1]["id"])
        granted = await call(bob, "claim_ticket", ticket_id=ticket["ticket"], wait_s=25)
        assert granted["state"] == "claimed" and granted["lease"]["device"] == "sim-board-1", granted
        lease = await call(bob, "lease_status", lease_id=granted["lease"]["id"], wait_s=25, unless="pending")
        assert lease["holder"] == "bob" and lease["state"] == "active"
        mine = await call(bob, "my_tickets")
        assert [t["ticket"] for t in mine["tickets"]] == [ticket["ticket"]]
        refused = await bob.call_tool("cancel_ticket", {"ticket_id": ticket["ticket"]})
        assert refused.is_error and "ticket_ended" in refused.content[0].text
        await call(bob, "release", lease_id=lease["id"])
        await call(alice, "release", lease_id=held[0]["id"])
