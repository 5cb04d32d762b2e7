"""The lease gate (docs/architecture.md, "The lease gate"): endpoints that admit only the
lease's holder.

In an authenticated lab every service of a lease listens where only its gate reaches it (a
unix socket in a folder only the exporter's account enters: ``HostContext.private_dir``; a
program that can only take a port listens on loopback, and asks for the secret itself), and
what is published is a gate: a relay process that reads one line, ``DEVLOOP <secret>``,
answers ``OK`` and only then relays to the service. A connection without the secret is
closed before a byte reaches the device. The secret comes with the lease and dies with it.

Clients speak the handshake through :class:`LocalForward` (the CLI's console and adb,
the coordinator's ``uart_exchange``) or ``device-loop forward`` (local ports for
unmodified tools).

Each part of the data plane has a secret of its own (``gate_secret``: the lease's secret and
the scope operation its endpoints need, ``uart``, ``camera``...), so a token whose scope gives
it a lease's camera and not its console is shown the camera's secret alone, and the console's
gate refuses that one.

A browser cannot send that line, so the gate of an HTTP endpoint (a camera's stream, a
VNC viewer) also admits requests whose path starts with ``/<secret>/``: the capability is
in the URL, which goes only to the lease's holder. The gate checks every request of the
connection (browsers keep connections open) and takes the capability out of its path
before the service sees it; a websocket upgrade then turns the connection into a plain
relay. Anything else gets 403, or the connection closed, and not a byte of the service.

A gate does not outlive its authority, the exporter that started it. The exporter holds
the write end of a pipe, its lifeline (``ProcessRegistry.lifeline``), and the gate the read
end: once the exporter is gone, however it went (kill -9 too), the gate admits nothing new
(a new connection is told why and closed, a kept-alive one takes no further request),
cuts the live connections after a grace (``GRACE_S``; ``DEVICE_LOOP_GATE_GRACE_S`` in the
exporter's environment) and exits, which closes its port. Otherwise a lease revoked while
its exporter is down would keep reaching the device until that exporter came back. The
next exporter start stops a gate still in its grace, with the other processes the last
run left.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import base64
import dataclasses
import hashlib
import hmac
import math
import os
import select
import socket
import stat
import sys
import threading
import urllib.parse
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from .ports import inherited_listener
from .process import python_module
from .tcp_relay import UNIX, connect, pipe

if TYPE_CHECKING:
    from .host import HostContext
    from .model import Endpoint, LeaseRef, Resource, Service

SECRET_ENV = "DEVLOOP_GATE_SECRET"  # not argv: others on the host may read command lines
HELLO = b"DEVLOOP "
HANDSHAKE_S = 5.0
GRACE_ENV = "DEVICE_LOOP_GATE_GRACE_S"
GRACE_S = 5.0  # live connections go on this long once the exporter is gone
MAX_GRACE_S = 60.0
_ORPHANED = b"the exporter of this endpoint stopped; once it is back, device-loop status gives the lease's endpoints\n"
ORPHANED_DENIED = b"DENIED: " + _ORPHANED
HTTP_ORPHANED = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n" + _ORPHANED
HTTP_DENIED = (b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
               b"this endpoint belongs to a lease: use the URL its lease gives (device-loop status)\n")


def gate_secret(lease_secret: str, operation: str) -> str:
    """The secret of a lease's gates whose endpoints need scope ``operation`` (``uart``,
    ``camera``...: ``core.scopes.data_plane_operation``): derived from the lease's secret, which
    only the coordinator and the exporter hold, so one part's secret opens no other's."""
    digest = hmac.new(lease_secret.encode(), b"device-loop gate " + operation.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")[:32]


def _gone(lifeline: int) -> bool:
    """Whether the exporter that started this gate is gone: its lifeline ended (nothing is
    ever written to it, so readable means the end)."""
    poll = select.poll()
    poll.register(lifeline, select.POLLIN)
    return bool(poll.poll(0))


async def _until_gone(lifeline: int) -> None:
    loop = asyncio.get_running_loop()
    gone = asyncio.Event()
    loop.add_reader(lifeline, gone.set)
    try:
        await gone.wait()
    finally:
        loop.remove_reader(lifeline)


def grace_s(environ: Mapping[str, str] = os.environ) -> float:
    """How long a gate lets its live connections go on once its exporter is gone: ``GRACE_S``
    unless ``DEVICE_LOOP_GATE_GRACE_S`` says otherwise. Raises ``ValueError`` if that is not
    a number of seconds from 0 to ``MAX_GRACE_S``."""
    text = environ.get(GRACE_ENV, "")
    if not text:
        return GRACE_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_GRACE_S:
        raise ValueError(f"{GRACE_ENV} is {text!r}: set it to a number of seconds from 0 to {MAX_GRACE_S:g}, "
                         f"or unset it")
    return value


async def _first_line(reader: asyncio.StreamReader) -> bytes:
    """Up to the first CR or LF (a serial console user ends lines with CR), 256 bytes at most."""
    line = b""
    while len(line) < 256:
        byte = await reader.read(1)
        if byte in (b"", b"\r", b"\n"):
            break
        line += byte
    return line


def _capability(line: bytes, secret: bytes) -> bytes | None:
    """An HTTP request line whose path starts with ``/<secret>/``, without that prefix."""
    method, _, rest = line.partition(b" ")
    path, _, version = rest.partition(b" ")
    prefix = b"/" + secret + b"/"
    if method in (b"GET", b"HEAD") and version.startswith(b"HTTP/1.") \
            and hmac.compare_digest(path[:len(prefix)], prefix):
        return b"%s /%s %s" % (method, path[len(prefix):], version)
    return None


async def _requests(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes,
                    request: bytes | None, lifeline: int) -> None:
    """Client -> service through an HTTP endpoint's gate: each request's line (``request``,
    checked already, then the next ones) with its capability taken out; a websocket upgrade
    makes the rest a plain relay. A request without the capability, or after the exporter
    is gone, ends the connection."""
    try:
        while request is not None:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HANDSHAKE_S * 12)
            writer.write(request + b"\r" + head)  # (the head goes on from the LF after the line)
            if b"\nupgrade:" in head.lower():
                return await pipe(reader, writer)
            line = await _first_line(reader)
            request = _capability(line, secret) if line and not _gone(lifeline) else None
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()


async def _gate(listener: socket.socket, target: str, secret: bytes, lifeline: int, grace: float,
                http: bool = False) -> None:
    live: set[asyncio.Task] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # (the server runs each connection's handler in a task of its own)
        live.add(task)
        try:
            await admit(reader, writer)
        finally:
            live.discard(task)

    async def admit(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(_first_line(reader), HANDSHAKE_S)
        except (asyncio.TimeoutError, ConnectionError):
            line = b""
        if _gone(lifeline):
            writer.write(HTTP_ORPHANED if http else ORPHANED_DENIED)
            writer.close()
            return
        request = _capability(line, secret) if http else None
        if request is None and not hmac.compare_digest(line, HELLO + secret):
            writer.write(HTTP_DENIED if http else b"DENIED: this endpoint belongs to a lease; connect with "
                                                   b"device-loop forward\n")
            writer.close()
            return
        try:
            service_reader, service_writer = await connect(target)
        except OSError:
            writer.close()
            return
        if request is None:
            writer.write(b"OK\n")
            upstream = pipe(reader, service_writer)
        else:
            upstream = _requests(reader, service_writer, secret, request, lifeline)
        await asyncio.gather(upstream, pipe(service_reader, writer))

    # the server stays open until the process ends: closing it could drop a connection it
    # is accepting (asyncio leaves that one hanging), while admit() refuses each one
    await asyncio.start_server(handle, sock=listener)
    await _until_gone(lifeline)
    print(f"the exporter that started this gate is gone: it admits nobody now, and cuts its {len(live)} live "
          f"connection(s) within {grace:g}s", file=sys.stderr, flush=True)
    if live:
        await asyncio.wait(set(live), timeout=grace)
    # returning ends the process: asyncio.run cancels what is left, and the port and the
    # connections close with it


def gate_service(host: HostContext, resource: Resource, lease: LeaseRef, service: Service) -> Service:
    """Put a gate in front of every endpoint of ``service`` (which listens on loopback); each
    ends with this process (its lifeline)."""
    if lease.secret is None:
        raise ValueError(f"lease {lease.id} has no secret: there is nothing a gate could ask for")
    secret, gated = lease.secret, []
    grace = grace_s()
    for endpoint in service.endpoints:
        http = endpoint.protocol == "http"
        target = f"{UNIX}{endpoint.path}" if endpoint.path else f"127.0.0.1:{endpoint.port}"
        argv = [*python_module("device_loop.core.gate"), "--fd", "{fd}", "--to", target,
                "--lifeline", "{lifeline}", "--grace", f"{grace:g}", *(["--http"] if http else [])]
        front = host.serve_on_free_port(argv, resource, lease, name=f"gate-{endpoint.protocol or endpoint.kind}",
                                        protocol=endpoint.protocol, params=endpoint.params,
                                        env={**os.environ, SECRET_ENV: secret}, command=endpoint.command,
                                        role=endpoint.role)
        gated += [dataclasses.replace(e, kind=endpoint.kind, env=endpoint.env,
                                      url=_gated_url(endpoint, e, secret))
                  for e in front.endpoints]
        service.processes += front.processes
    service.endpoints = gated
    return service


def _gated_url(service_endpoint: Endpoint, gate_endpoint: Endpoint, secret: str) -> str | None:
    """The URL of an HTTP endpoint through its gate: the capability is its first path segment."""
    if service_endpoint.protocol != "http" or service_endpoint.url is None:
        return None
    parts = urllib.parse.urlsplit(service_endpoint.url)
    query = f"?{parts.query}" if parts.query else ""
    return f"http://{gate_endpoint.host}:{gate_endpoint.port}/{secret}{parts.path or '/'}{query}"


def connect_gated(host: str, port: int, secret: str, timeout: float = 10.0) -> socket.socket:
    """A socket past the gate of ``host:port``: the handshake is done."""
    sock = socket.create_connection((host, port), timeout=timeout)
    answer = b""
    try:
        sock.sendall(HELLO + secret.encode() + b"\n")
        while not answer.endswith(b"\n"):
            chunk = sock.recv(1)
            if not chunk:
                break
            answer += chunk
    except (BrokenPipeError, ConnectionResetError):
        pass  # the gate went away during the handshake (its exporter stopped): a refusal all the same
    if answer != b"OK\n":
        sock.close()
        said = answer.decode(errors="replace").strip() or "it closed the connection"
        raise ConnectionRefusedError(f"the gate of {host}:{port} refused: {said}")
    sock.settimeout(None)
    return sock


async def serve_forward(listener: socket.socket, host: str, port: int, secret: str) -> None:
    """Relay every local connection on ``listener`` through the gate of ``host:port``."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            sock = await asyncio.to_thread(connect_gated, host, port, secret)
        except OSError:
            writer.close()
            return
        remote_reader, remote_writer = await asyncio.open_connection(sock=sock)
        try:
            await asyncio.gather(pipe(reader, remote_writer), pipe(remote_reader, writer))
        except asyncio.CancelledError:
            # the forward is closing: its connections end with it. Ended, not cancelled, since
            # asyncio's stream callback logs a cancelled handler as an error on 3.11
            writer.close()
            remote_writer.close()

    server = await asyncio.start_server(handle, sock=listener)
    async with server:
        await server.serve_forever()


class LocalForward:
    """A local port that passes the gate of ``endpoint``, served from a thread, until
    closed. ``.endpoint`` is where to connect instead. Anyone on this machine may use the
    port while it is open: keep it open no longer than needed."""

    def __init__(self, endpoint: Mapping[str, Any], secret: str):
        listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = {**endpoint, "host": "127.0.0.1", "port": listener.getsockname()[1]}
        self._loop = asyncio.new_event_loop()
        self._serving = self._loop.create_task(serve_forward(listener, endpoint["host"], endpoint["port"], secret))
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close the port; returns once it is closed."""
        async def stop() -> None:
            self._serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._serving  # closes the listening socket
            # the connections it relays still (an ssh that exited, an adb client): ended here,
            # not left pending in a loop about to close
            relaying = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in relaying:
                task.cancel()
            await asyncio.gather(*relaying, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> "LocalForward":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def local_forwards(endpoints: Sequence[Mapping[str, Any]]) -> tuple[list[LocalForward], list[dict[str, Any]]]:
    """A ``LocalForward`` for each gated endpoint (past its gate with its own secret), and the
    endpoints to use: each gated one replaced by its forward's. Close the forwards when done."""
    forwards, usable = [], []
    for endpoint in endpoints:
        secret = endpoint.get("secret")
        if secret:
            forwards.append(LocalForward(endpoint, secret))
            usable.append(forwards[-1].endpoint)
        else:
            usable.append(dict(endpoint))
    return forwards, usable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="inherited listening socket")
    parser.add_argument("--to", required=True, help="HOST:PORT (or unix:PATH) of the service")
    parser.add_argument("--http", action="store_true", help="also admit HTTP requests under /<secret>/")
    parser.add_argument("--lifeline", type=int, required=True,
                        help="inherited read end of the exporter's lifeline: its end ends the gate")
    parser.add_argument("--grace", type=float, default=GRACE_S,
                        help=f"seconds live connections go on once the exporter is gone ({GRACE_S:g})")
    args = parser.parse_args()
    secret = os.environ.pop(SECRET_ENV, "")
    if not secret:
        sys.exit(f"{SECRET_ENV} is not set: a gate without a secret would admit nobody")
    if not 0 <= args.grace <= MAX_GRACE_S:
        parser.error(f"--grace takes a number of seconds from 0 to {MAX_GRACE_S:g}")
    try:
        is_pipe = stat.S_ISFIFO(os.fstat(args.lifeline).st_mode)
    except OSError:
        is_pipe = False
    if not is_pipe:
        sys.exit(f"--lifeline {args.lifeline} is not an inherited pipe: a gate must end with the exporter "
                 f"that started it")
    asyncio.run(_gate(inherited_listener(args.fd), args.to, secret.encode(), args.lifeline, args.grace, args.http))


if __name__ == "__main__":
    main()
