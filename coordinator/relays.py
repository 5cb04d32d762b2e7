"""What the coordinator relays for agents, who may have no terminal and no browser: one
camera snapshot, one short UART exchange (docs/architecture.md, "The parts": the only data
that passes through the coordinator, each bounded in size and time).

A snapshot is fetched only from the exporter host's own reported address, the camera
endpoint's own port and a plain path, and passed on only as a JPEG of bounded size: never
from a URL an exporter supplies.
"""
from __future__ import annotations

import asyncio
import re
import urllib.parse

import httpx2

from device_loop.core.uart_client import exchange
from device_loop.core.usage import EndpointJSON, camera_endpoint
from device_loop.core.vocabulary import EndpointRole

from .answers import LeaseAnswer
from .errors import APIError

EXCHANGE_MAX_WAIT_S = 10.0
EXCHANGE_MAX_BYTES = 64 * 1024
SNAPSHOT_TIMEOUT_S = 15.0  # the whole fetch of a camera's snapshot, not each read
SNAPSHOT_MAX_BYTES = 8 << 20
JPEG_MAGIC = b"\xff\xd8\xff"
_PATH_SEGMENT = re.compile(r"^[A-Za-z0-9._~-]+$")
_MEDIA_TYPE = re.compile(r"^[a-z0-9.+-]{1,30}/[a-z0-9.+-]{1,30}$")


async def camera_snapshot(lease: LeaseAnswer, host_address: str | None) -> bytes:
    """The current frame of the lease's camera, as JPEG bytes (``APIError`` with the reason)."""
    device = lease["device"]
    if not lease["ready"]:
        raise APIError(409, "not_ready", f"{device}'s camera cannot be looked through now: {lease['reason']}")
    endpoint = camera_endpoint(lease)
    if endpoint is None:
        raise APIError(409, "no_camera", f"{device} has no camera (its endpoints: "
                                         f"{', '.join(e['kind'] for e in lease['endpoints']) or 'none'})")
    try:
        return await _fetch_snapshot(_snapshot_url(host_address, lease["host"] or "", endpoint))
    except _Refused as why:
        raise APIError(409, "camera_refused", f"{device}'s camera {why}") from None


async def uart_exchange(lease: LeaseAnswer, send: str, wait_s: float) -> dict:
    """Send ``send`` to the lease's console once; what it printed within ``wait_s`` seconds."""
    data = send.encode()
    if len(data) > EXCHANGE_MAX_BYTES:
        raise APIError(413, "too_large", f"send is {len(data)} bytes; at most {EXCHANGE_MAX_BYTES // 1024} KiB go "
                                         "at once")
    consoles = sorted((e for e in lease["endpoints"] if e.get("role") == EndpointRole.CONSOLE),
                      key=lambda e: e.get("protocol") != "rfc2217")  # RFC 2217 sets the line; raw cannot
    if not lease["ready"] or not consoles:
        raise APIError(409, "no_console", f"{lease['device']} has no UART to talk to now: {lease['reason']}")
    wait = min(max(wait_s, 0.0), EXCHANGE_MAX_WAIT_S)
    try:
        output, cut = await asyncio.to_thread(exchange, consoles[0], data, wait, EXCHANGE_MAX_BYTES, lease["secret"])
    except Exception as exc:  # the serial link: refused, lost, busy
        raise APIError(409, "console_unreachable", f"cannot talk to {lease['device']}'s UART: {exc}") from None
    return {"output": output.decode(errors="replace"), "truncated": cut, "waited_s": wait}


class _Refused(Exception):
    """Why a camera's snapshot is not handed to the agent (it follows "DEVICE's camera")."""


def _snapshot_url(address: str | None, host: str, endpoint: EndpointJSON) -> str:
    """Where a camera's snapshot is fetched (never a URL an exporter supplies):
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


