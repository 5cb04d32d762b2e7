"""The MCP route for agents: the same rules as REST, as tools (DESIGN §7).

Streamable HTTP, stateless (any coordinator process can answer), JSON answers. Each
tool asks ``caller_identity`` who calls, exactly as a REST route does, and every
refusal is a ``ToolError`` whose message an agent can act on.
"""
from __future__ import annotations

import asyncio
from typing import Any

import httpx2
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings

from device_loop.core.uart_client import exchange
from device_loop.core.usage import camera_urls

from .errors import APIError
from .identity import ANYONE, USER, Identity, caller_identity, check_access
from .lifecycle import STATES
from .origin import allowed_hosts

EXCHANGE_MAX_WAIT_S = 10.0
EXCHANGE_MAX_BYTES = 64 * 1024
FLASH_STATUS_MAX_WAIT_S = 30.0
SNAPSHOT_TIMEOUT_S = 15.0


async def _never_hangs_up() -> None:
    """A tool's wait is bounded by its own ``wait_s``; the SDK ends the call if the agent goes."""
    await asyncio.get_running_loop().create_future()


def build_mcp(rules) -> MCPServer:
    server = MCPServer("device-loop", instructions=(
        "Reserve lab devices by name, wait until their endpoints are up, talk to them, give them back. "
        "reserve never blocks: poll lease_status until ready. Release what you no longer need."))

    async def who(ctx: Context, access: str = USER) -> Identity:
        """The caller, if it may call a tool of ``access`` (the public board's are ANYONE's,
        as the same REST routes are)."""
        try:
            identity = await caller_identity(ctx.request_context.request)
            check_access(access, identity)
        except APIError as exc:
            if exc.code == "unauthenticated":  # an agent has no token file: say what it sends
                raise ToolError("this needs a token: send it as the HTTP header 'Authorization: Bearer TOKEN' "
                                "(ask a lab admin for one)") from None
            raise ToolError(exc.message) from None
        return identity

    async def ask(call) -> Any:
        try:
            return await call
        except APIError as exc:  # the same code REST answers with, for agents that branch on it
            raise ToolError(f"{exc.message} [{exc.code}]") from None

    @server.tool()
    async def list_devices(ctx: Context, state: str | None = None, tags: list[str] | None = None) -> dict[str, Any]:
        """Devices of the lab with state, host, holder and time left; filter by state
        (idle, in_use, ...) and by tags (all must match)."""
        await who(ctx, ANYONE)
        if state is not None and state not in STATES:
            raise ToolError(f"no device state is called {state!r}; the states are {', '.join(STATES)}")
        devices = [d for d in await rules.list_devices()
                   if (state is None or d["state"] == state) and set(tags or ()) <= set(d["tags"])]
        return {"devices": devices}

    @server.tool()
    async def device_info(ctx: Context, device: str) -> dict[str, Any]:
        """One device: class, tags, state, host, holder, resources and their health."""
        await who(ctx, ANYONE)
        return await ask(rules.device_info(device))

    @server.tool()
    async def reserve(ctx: Context, device: str, ttl_s: float | None = None) -> dict[str, Any]:
        """Reserve a device by name. Answers at once with a lease (state 'pending' until its
        endpoints are up: then poll lease_status) or says why not and what is free instead."""
        caller = await who(ctx)
        return await ask(rules.reserve(device, ttl_s, caller.name, caller.admin))

    @server.tool()
    async def lease_status(ctx: Context, lease_id: str) -> dict[str, Any]:
        """A lease: state, endpoints, expires_at, a plain reason while it is not ready, and
        commands to run against its endpoints."""
        caller = await who(ctx)
        return await ask(rules.lease_status(lease_id, caller.name, caller.admin))

    @server.tool()
    async def renew(ctx: Context, lease_id: str, ttl_s: float) -> dict[str, Any]:
        """Extend a lease: it then expires ttl_s seconds from now."""
        caller = await who(ctx)
        return await ask(rules.renew(lease_id, ttl_s, caller.name, caller.admin))

    @server.tool()
    async def release(ctx: Context, lease_id: str) -> dict[str, Any]:
        """Give a device back."""
        caller = await who(ctx)
        return await ask(rules.release(lease_id, caller.name, caller.admin))

    @server.tool()
    async def device_log(ctx: Context, device: str) -> dict[str, Any]:
        """The device's last 20 state changes: time, from, to, cause, actor."""
        await who(ctx, ANYONE)
        return {"entries": await ask(rules.device_log(device))}

    @server.tool()
    async def list_images(ctx: Context, device: str | None = None) -> dict[str, Any]:
        """Images in the lab's registry (for ``device`` and its class, if given): name,
        sha256, size, and which devices or classes each is known-good for."""
        await who(ctx)
        return {"images": await ask(rules.list_images(device))}

    @server.tool()
    async def flash(ctx: Context, lease_id: str, image: str) -> dict[str, Any]:
        """Flash an image (its name or sha256, from list_images) onto the device of your
        lease. Answers at once with the operation (state 'queued'): follow it with
        flash_status until its state is 'done' or 'failed'. A failure part-way leaves the
        device needing recovery: then call recover."""
        caller = await who(ctx)
        return await ask(rules.flash(lease_id, image, caller.name, caller.admin))

    @server.tool()
    async def flash_status(ctx: Context, op_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        """A flash operation: state (queued, running, done, failed), phase (fetching,
        writing, verifying), bytes done of total, and its result's message. With wait_s
        (at most 30), answers as soon as its state changes, or after wait_s."""
        await who(ctx)
        op = await ask(rules.op(op_id))
        wait = min(max(wait_s, 0.0), FLASH_STATUS_MAX_WAIT_S)
        return await ask(rules.wait_op(op_id, op["state"], wait, _never_hangs_up)) if wait else op

    @server.tool()
    async def recover(ctx: Context, lease_id: str) -> dict[str, Any]:
        """Flash the latest known-good image of your leased device (else of its class) back
        onto it; its success clears the device's needs_recovery. Follow it with flash_status."""
        caller = await who(ctx)
        return await ask(rules.recover(lease_id, caller.name, caller.admin))

    @server.tool()
    async def camera_snapshot(ctx: Context, lease_id: str) -> Image:
        """The current frame of the leased device's camera, as an image: see its screen (a
        boot menu, a panic, a login prompt) even when its OS is dead."""
        caller = await who(ctx)
        lease = await ask(rules.lease_status(lease_id, caller.name, caller.admin))
        if not lease["ready"]:
            raise ToolError(f"{lease['device']}'s camera cannot be looked through now: {lease['reason']}")
        urls = camera_urls(lease)
        if urls is None:
            raise ToolError(f"{lease['device']} has no camera (its endpoints: "
                            f"{', '.join(e['kind'] for e in lease['endpoints'])})")
        url = urls["snapshot"]
        try:
            async with httpx2.AsyncClient(timeout=SNAPSHOT_TIMEOUT_S, verify=False) as http:
                answer = await http.get(url)
        except httpx2.HTTPError as exc:
            raise ToolError(f"cannot reach {lease['device']}'s camera: {exc}") from None
        if answer.status_code != 200:
            raise ToolError(f"{lease['device']}'s camera answered {answer.status_code}: {answer.text.strip()}")
        return Image(data=answer.content, format="jpeg")

    @server.tool()
    async def uart_exchange(ctx: Context, lease_id: str, send: str, wait_s: float = 2.0) -> dict[str, Any]:
        """Send text to the leased device's UART once (include the line ending, e.g. '\\r')
        and return what it printed within wait_s seconds (at most 10 s and 64 KiB)."""
        caller = await who(ctx)
        if len(send.encode()) > EXCHANGE_MAX_BYTES:
            raise ToolError(f"send is {len(send.encode())} bytes; at most {EXCHANGE_MAX_BYTES // 1024} KiB go at once")
        lease = await ask(rules.lease_status(lease_id, caller.name, caller.admin))
        uarts = sorted((e for e in lease["endpoints"] if e["kind"] == "uart"), key=lambda e: e.get("protocol") != "rfc2217")
        if not lease["ready"] or not uarts:
            raise ToolError(f"{lease['device']} has no UART to talk to now: {lease['reason']}")
        wait = min(max(wait_s, 0.0), EXCHANGE_MAX_WAIT_S)
        try:
            output, cut = await asyncio.to_thread(exchange, uarts[0], send.encode(), wait, EXCHANGE_MAX_BYTES,
                                                  lease["secret"])
        except Exception as exc:  # the serial link: refused, lost, busy
            raise ToolError(f"cannot talk to {lease['device']}'s UART: {exc}") from None
        return {"output": output.decode(errors="replace"), "truncated": cut, "waited_s": wait}

    return server


def mcp_app(rules, extra_hosts: list[str]):
    """(the Starlette app serving /mcp, its session manager: run it in the parent's lifespan)."""
    server = build_mcp(rules)
    hosts = allowed_hosts(extra_hosts)
    origins = [f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")]
    app = server.streamable_http_app(
        streamable_http_path="/mcp", stateless_http=True, json_response=True,
        transport_security=TransportSecuritySettings(allowed_hosts=hosts, allowed_origins=origins))
    return app, server.session_manager
