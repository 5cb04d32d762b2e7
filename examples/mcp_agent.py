"""An agent's session with device-loop over MCP, with the ``mcp`` SDK's own client: reserve
a board, wait until it is ready, exchange a line on its UART, give it back.

    DEVICE_LOOP_COORDINATOR=http://lab.tailnet:7420 DEVICE_LOOP_TOKEN=dl_... python examples/mcp_agent.py sim-board-0

(In the trust mode of ``device-loop up`` no token is needed.) tests/test_mcp.py runs this
file as it is, against a real coordinator and exporter.
"""
import asyncio
import os
import sys

import httpx2  # the HTTP client the mcp SDK itself uses
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

LAB = os.environ.get("DEVICE_LOOP_COORDINATOR", "http://127.0.0.1:7420")
TOKEN = os.environ.get("DEVICE_LOOP_TOKEN")
READY_WITHIN_S = 60


async def call(agent: Client, tool: str, **args) -> dict:
    """A tool's structured answer; a refusal ends the script with its message."""
    result = await agent.call_tool(tool, args)
    if result.is_error:
        raise SystemExit(f"{tool}: {result.content[0].text}")
    return result.structured_content


async def main(device: str) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"} if TOKEN else {}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http, \
            Client(streamable_http_client(f"{LAB}/mcp", http_client=http)) as agent:
        lease = await call(agent, "reserve", device=device, ttl_s=600)  # answers at once, "pending"
        try:
            for _ in range(READY_WITHIN_S * 5):  # reserve never blocks: poll until the endpoints are up
                if lease["ready"] or lease["state"] not in ("pending", "active"):
                    break
                await asyncio.sleep(0.2)
                lease = await call(agent, "lease_status", lease_id=lease["id"])
            if not lease["ready"]:
                raise SystemExit(f"{device} is not ready: {lease['reason']}")
            said = await call(agent, "uart_exchange", lease_id=lease["id"], send="uname\r", wait_s=1)
            print(said["output"])
        finally:
            await call(agent, "release", lease_id=lease["id"])
            print(f"released {device}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "sim-board-0"))
