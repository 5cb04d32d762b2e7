"""Free TCP ports, picked by the exporter (plugins never choose numbers), and the unix
sockets services behind a lease's gates listen on instead."""
import errno
import os
import random
import socket
import time
from pathlib import Path

UNIX_TABLE = "/proc/net/unix"
ACCEPTING = 0x10000  # __SO_ACCEPTCON in /proc/net/unix's flags: a listening socket


def listen_socket(address: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A bound, listening TCP socket; pass it to a child with ``pass_fds`` to avoid races."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(64)
    return sock


def listen_unix(path: str | os.PathLike) -> socket.socket:
    """A listening unix socket bound at ``path`` (which must not exist): who may connect is who
    may enter its folder."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(path))
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    return sock


def unix_listening(paths: set[str]) -> set[str]:
    """Which of ``paths`` a socket listens on now (the kernel's table of unix sockets): for a
    program that takes a path to listen on, without connecting to it (a connection may be a
    client to it: ser2net opens the serial device for one)."""
    try:
        lines = Path(UNIX_TABLE).read_text().splitlines()[1:]
    except OSError:
        return set()
    found = set()
    for line in lines:
        fields = line.split(maxsplit=7)
        if len(fields) == 8 and fields[7] in paths and int(fields[3], 16) & ACCEPTING:
            found.add(fields[7])
    return found


def inherited_listener(fd: int) -> socket.socket:
    """The listening socket a service process was started with: ``{fd}`` in the argv given
    to ``HostContext.serve_on_free_port``. Accept connections on it as on any socket."""
    return socket.socket(fileno=fd)


class PortsExhausted(OSError):
    """Every port of a range is taken."""


def listen_in_range(address: str, first: int, last: int) -> socket.socket:
    """A listening TCP socket on a free port of ``first``-``last`` (tried from a random one on,
    so that two exporters of a host do not race for the same); ``PortsExhausted`` when every
    one is taken."""
    count = last - first + 1
    start = random.randrange(count)
    for step in range(count):
        try:
            return listen_socket(address, first + (start + step) % count)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise PortsExhausted(errno.EADDRINUSE, f"no free port in {first}-{last} on {address}: all {count} are taken "
                                           f"(the exporter's port_range: widen it, or end some leases)")


def free_port(address: str = "127.0.0.1") -> int:
    """A port that was free a moment ago, for programs that only take a number."""
    with listen_socket(address) as sock:
        return sock.getsockname()[1]


def port_is_free(address: str, port: int) -> bool:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
        return True
    except OSError:
        return False


def wait_port_free(address: str, port: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not port_is_free(address, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def wait_port_open(address: str, port: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
