"""Free TCP ports, picked by the exporter (plugins never choose numbers)."""
import socket
import time


def listen_socket(address: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A bound, listening TCP socket; pass it to a child with ``pass_fds`` to avoid races."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(64)
    return sock


def inherited_listener(fd: int) -> socket.socket:
    """The listening socket a service process was started with: ``{fd}`` in the argv given
    to ``HostContext.serve_on_free_port``. Accept connections on it as on any socket."""
    return socket.socket(fileno=fd)


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
