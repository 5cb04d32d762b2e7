"""The MCP route for agents: the same rules as REST, as tools (DESIGN §7).

Streamable HTTP, stateless (any coordinator process can answer), JSON answers. Each
tool asks ``caller_identity`` who calls, exactly as a REST route does, and every
refusal is a ``ToolError`` whose message an agent can act on.
"""
from __future__ import annotations

import asyncio
import re
import urllib.parse
from typing import Any

import httpx2
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings

from device_loop.core import __version__
from device_loop.core.uart_client import exchange
from device_loop.core.usage import camera_endpoint

from .errors import APIError
from .identity import ANYONE, USER, Identity, caller_identity, check_access
from .lifecycle import STATES
from .origin import allowed_hosts

EXCHANGE_MAX_WAIT_S = 10.0
EXCHANGE_MAX_BYTES = 64 * 1024
FLASH_STATUS_MAX_WAIT_S = 30.0
SNAPSHOT_TIMEOUT_S = 15.0  # the whole fetch of a camera's snapshot, not each read
SNAPSHOT_MAX_BYTES = 8 << 20
JPEG_MAGIC = b"\xff\xd8\xff"
_PATH_SEGMENT = re.compile(r"^[A-Za-z0-9._~-]+$")
_MEDIA_TYPE = re.compile(r"^[a-z0-9.+-]{1,30}/[a-z0-9.+-]{1,30}$")


async def _never_hangs_up() -> None:
    """A tool's wait is bounded by its own ``wait_s``; the SDK ends the call if the agent goes."""
    await asyncio.get_running_loop().create_future()


def build_mcp(rules) -> MCPServer:
    server = MCPServer("device-loop", version=__version__, instructions=(
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
        """Images in the lab's registry (for ``device`` and its class, if given): ref (name
        an image by it: sha256: and the start of its digest), name, sha256, size, and which
        devices or classes each is known-good for."""
        await who(ctx)
        return {"images": await ask(rules.list_images(device))}

    @server.tool()
    async def flash(ctx: Context, lease_id: str, image: str) -> dict[str, Any]:
        """Flash an image (its ref, sha256:..., or its name, from list_images) onto the device of your
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
        caller = await who(ctx)
        op = await ask(rules.op(op_id, caller=caller.name, admin=caller.admin))
        wait = min(max(wait_s, 0.0), FLASH_STATUS_MAX_WAIT_S)
        return await ask(rules.wait_op(op_id, op["state"], wait, _never_hangs_up, caller=caller.name,
                                       admin=caller.admin)) if wait else op

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
        endpoint = camera_endpoint(lease)
        if endpoint is None:
            raise ToolError(f"{lease['device']} has no camera (its endpoints: "
                            f"{', '.join(e['kind'] for e in lease['endpoints'])})")
        try:
            address = await rules.host_address(lease["host"])
            jpeg = await _fetch_snapshot(_snapshot_url(address, lease["host"], endpoint))
        except _Refused as why:
            raise ToolError(f"{lease['device']}'s camera {why}") from None
        return Image(data=jpeg, format="jpeg")

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


class _Refused(Exception):
    """Why a camera's snapshot is not handed to the agent (it follows "DEVICE's camera")."""


def _snapshot_url(address: str | None, host: str, endpoint: dict) -> str:
    """Where a camera's snapshot is fetched (DESIGN §7: never a URL an exporter supplies):
    the host's own address, the endpoint's port, and a plain path (its URL's, then its
    ``snapshot`` param, as the video plugin reports them)."""
    if address is None:
        raise _Refused(f"cannot be looked through: host {host}'s exporter did not report its address (an older "
                       "device-loop?), and the coordinator fetches a snapshot only from a host's own address; "
                       "upgrade that exporter")
    if endpoint["host"] != address:
        raise _Refused(f"is at {endpoint['host']}, not at host {host}'s own address {address}")
    try:
        base = urllib.parse.urlsplit(endpoint.get("url") or "/").path or "/"
    except ValueError:
        base = "?"
    path = base[:base.rindex("/") + 1] + endpoint["params"]["snapshot"] if "/" in base else "?"
    if not path.startswith("/") or not all(_PATH_SEGMENT.match(segment) and segment not in (".", "..")
                                           for segment in path.split("/")[1:]):
        raise _Refused(f"has a snapshot path that is not a plain path ({path[:100]!r}): letters, digits, "
                       "'.', '_', '~', '-' between slashes")
    return f"http://{f'[{address}]' if ':' in address else address}:{int(endpoint['port'])}{path}"


async def _fetch_snapshot(url: str) -> bytes:
    """A camera's current frame: a JPEG (by its first bytes) of ``SNAPSHOT_MAX_BYTES`` at
    most, within ``SNAPSHOT_TIMEOUT_S``, no redirect followed, no proxy, nothing decompressed."""
    body = bytearray()
    try:
        async with asyncio.timeout(SNAPSHOT_TIMEOUT_S):
            async with httpx2.AsyncClient(timeout=SNAPSHOT_TIMEOUT_S, follow_redirects=False, trust_env=False) as http:
                async with http.stream("GET", url, headers={"Accept": "image/jpeg",
                                                            "Accept-Encoding": "identity"}) as answer:
                    _check_head(answer)
                    async for chunk in answer.aiter_raw():
                        body += chunk
                        if len(body) > SNAPSHOT_MAX_BYTES:
                            raise _Refused(f"sent more than {SNAPSHOT_MAX_BYTES >> 20} MiB: a snapshot is smaller")
    except TimeoutError:
        raise _Refused(f"did not send its frame within {SNAPSHOT_TIMEOUT_S:g} s") from None
    except httpx2.HTTPError as exc:
        raise _Refused(f"cannot be reached: {exc}") from None
    if not body.startswith(JPEG_MAGIC):
        raise _Refused("sent something that is not a JPEG image")
    return bytes(body)


def _check_head(answer: httpx2.Response) -> None:
    """Refuse an answer by its status and headers (what they say is the server's: only
    the status code and a well-formed media type are repeated)."""
    if 300 <= answer.status_code < 400:
        raise _Refused(f"answered {answer.status_code}, a redirect: the coordinator follows none")
    if answer.status_code != 200:
        raise _Refused(f"answered {answer.status_code}")
    media = answer.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "image/jpeg":
        raise _Refused(f"answered {media if _MEDIA_TYPE.match(media) else 'something'}, not image/jpeg")
    if answer.headers.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
        raise _Refused("sent its frame encoded (compressed): the coordinator takes a plain JPEG only")
    declared = answer.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > SNAPSHOT_MAX_BYTES:
        raise _Refused(f"would send {int(declared) >> 20} MiB: a snapshot is at most {SNAPSHOT_MAX_BYTES >> 20} MiB")


def mcp_app(rules, extra_hosts: list[str]):
    """(the Starlette app serving /mcp, its session manager: run it in the parent's lifespan)."""
    server = build_mcp(rules)
    hosts = allowed_hosts(extra_hosts)
    origins = [f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")]
    app = server.streamable_http_app(
        streamable_http_path="/mcp", stateless_http=True, json_response=True,
        transport_security=TransportSecuritySettings(allowed_hosts=hosts, allowed_origins=origins))
    return app, server.session_manager
