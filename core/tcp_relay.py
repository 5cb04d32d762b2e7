"""A TCP relay process: ``python -m device_loop.core.tcp_relay --fd N --to HOST:PORT``.

Every connection accepted on the inherited listening socket is piped to ``HOST:PORT`` (or to
the unix socket ``unix:PATH``). Plugins whose device already speaks TCP (a console server, a
BMC) serve it with this.
"""
from __future__ import annotations

import argparse
import asyncio
import socket
from typing import TYPE_CHECKING

from .model import Service
from .ports import inherited_listener
from .process import python_module

if TYPE_CHECKING:
    from .host import HostContext
    from .model import LeaseRef, Resource


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


UNIX = "unix:"  # a target that is a unix socket's path


async def connect(target: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to ``target``: ``HOST:PORT``, or ``unix:PATH``."""
    if target.startswith(UNIX):
        return await asyncio.open_unix_connection(target[len(UNIX):])
    host, _, port = target.rpartition(":")
    return await asyncio.open_connection(host.strip("[]"), int(port))


async def _relay(listener: socket.socket, target: str) -> None:
    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            target_reader, target_writer = await connect(target)
        except OSError as exc:
            client_writer.write(f"cannot reach {target}: {exc.strerror}\r\n".encode())
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, target_writer), pipe(target_reader, client_writer))

    server = await asyncio.start_server(handle, sock=listener)
    async with server:
        await server.serve_forever()


def start_relay(host: HostContext, resource: Resource, lease: LeaseRef, target: str, command: str | None = None,
                protocol: str = "raw", role: str | None = None) -> Service:
    """Relay a free port of ``host`` to ``target`` (``host:port``, or ``unix:PATH``) for ``lease``; ``command``
    tells clients how to use it, ``protocol`` what they speak there, ``role`` what it is for
    (see ``Endpoint``)."""
    argv = [*python_module("device_loop.core.tcp_relay"), "--fd", "{fd}", "--to", target]
    return host.serve_on_free_port(argv, resource, lease, name="relay", command=command, protocol=protocol, role=role)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="inherited listening socket")
    parser.add_argument("--to", required=True, help="HOST:PORT (or unix:PATH) to relay to")
    args = parser.parse_args()
    asyncio.run(_relay(inherited_listener(args.fd), args.to))


if __name__ == "__main__":
    main()
