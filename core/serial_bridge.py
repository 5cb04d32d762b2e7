"""A TCP <-> serial bridge process: ``python -m device_loop.core.serial_bridge``.

Serves a serial device raw, or over telnet with RFC 2217 (so a remote client can change
the baud rate), the two modes ser2net offers. Used for the simulated boards, and for
real UARTs where ser2net is not installed. Like ser2net it opens the device for each
client, so a device that vanishes and comes back is picked up again, and a new client
takes over from the previous one (``kickolduser``). The listening socket is inherited
from the exporter (``--fd``), so the endpoint accepts the moment this process exists.
"""
from __future__ import annotations

import argparse
import selectors
import socket

import serial
from serial.rfc2217 import PortManager

from .model import Service
from .ports import inherited_listener
from .process import python_module
from .vocabulary import EndpointRole

#: How a person uses a serial console endpoint (it speaks the lease gate where there is one).
CONSOLE_COMMAND = "device-loop console {lease}"
FRAMING = {"N": serial.PARITY_NONE, "E": serial.PARITY_EVEN, "O": serial.PARITY_ODD}


def parse_framing(text: str) -> dict:
    """``8N1`` -> pyserial's bytesize, parity, stopbits."""
    if len(text) != 3 or text[0] not in "5678" or text[1].upper() not in FRAMING or text[2] not in "12":
        raise ValueError(f"framing must look like 8N1, not {text!r}")
    return {"bytesize": int(text[0]), "parity": FRAMING[text[1].upper()], "stopbits": int(text[2])}


class _Port(serial.Serial):
    """A serial port whose modem lines may not exist (a pty has none): setting them is a
    no-op and reading them says 'low', instead of failing the RFC 2217 session."""

    def _line(self, name: str) -> bool:
        try:
            return getattr(serial.Serial, name).fget(self)
        except OSError:
            return False

    cts = property(lambda self: self._line("cts"))
    dsr = property(lambda self: self._line("dsr"))
    ri = property(lambda self: self._line("ri"))
    cd = property(lambda self: self._line("cd"))

    def _update_dtr_state(self):
        try:
            super()._update_dtr_state()  # type: ignore[misc]  # (private: not in types-pyserial)
        except OSError:
            pass

    def _update_rts_state(self):
        try:
            super()._update_rts_state()  # type: ignore[misc]  # (private: not in types-pyserial)
        except OSError:
            pass

    def _update_break_state(self):
        try:
            super()._update_break_state()  # type: ignore[misc]  # (private: not in types-pyserial)
        except OSError:
            pass


class _Telnet:
    """RFC 2217 for one client: telnet in, serial out, and back."""

    def __init__(self, conn: socket.socket, port: serial.Serial):
        self.conn = conn
        # (types-pyserial wants rfc2217.Serial for both; pyserial takes any port, and anything with write())
        self.manager = PortManager(port, self)  # type: ignore[arg-type]

    def write(self, data: bytes) -> None:  # PortManager's way to answer the client
        self.conn.sendall(data)

    def from_client(self, data: bytes) -> bytes:
        return b"".join(self.manager.filter(data))

    def to_client(self, data: bytes) -> bytes:
        return b"".join(self.manager.escape(data))


class _Raw:
    def __init__(self, conn, port):
        pass

    @staticmethod
    def from_client(data: bytes) -> bytes:
        return data

    @staticmethod
    def to_client(data: bytes) -> bytes:
        return data


STOPPED = object()


def _accept(listener: socket.socket, stop_fd: int | None):
    """The next client, or ``STOPPED`` once ``stop_fd`` is readable."""
    if stop_fd is None:
        return listener.accept()[0]
    with selectors.DefaultSelector() as sel:
        sel.register(listener, selectors.EVENT_READ, "listener")
        sel.register(stop_fd, selectors.EVENT_READ, "stop")
        for key, _ in sel.select():
            if key.data == "stop":
                return STOPPED
        return listener.accept()[0]


def _pump(listener: socket.socket, conn: socket.socket, port, protocol, stop_fd: int | None):
    """Copy bytes both ways until one side closes; return a new client if one took over
    (``STOPPED`` once ``stop_fd`` is readable)."""
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "listener")
    sel.register(conn, selectors.EVENT_READ, "client")
    sel.register(port.fileno(), selectors.EVENT_READ, "serial")
    if stop_fd is not None:
        sel.register(stop_fd, selectors.EVENT_READ, "stop")
    try:
        while True:
            for key, _ in sel.select():
                if key.data == "stop":
                    return STOPPED
                if key.data == "listener":
                    newcomer, _ = listener.accept()
                    return newcomer
                if key.data == "client":
                    data = conn.recv(65536)
                    if not data:
                        return None
                    port.write(protocol.from_client(data))
                else:
                    try:
                        data = port.read(65536)
                    except serial.SerialException:
                        return None
                    if data:
                        conn.sendall(protocol.to_client(data))
    except OSError:
        return None
    finally:
        sel.close()


def serve(listener: socket.socket, device: str, baud: int, framing: str, rfc2217: bool,
          stop_fd: int | None = None) -> None:
    """Serve clients one after another (a newcomer takes over) until ``stop_fd`` is readable."""
    protocol_for = _Telnet if rfc2217 else _Raw
    conn = None
    while True:
        if conn is None:
            conn = _accept(listener, stop_fd)
            if conn is STOPPED:
                return
        try:
            port = _Port(device, baud, timeout=0, **parse_framing(framing))
            port.reset_input_buffer()
        except (serial.SerialException, OSError, ValueError) as exc:
            try:
                conn.sendall(f"device open failure: {exc}\r\n".encode())
            except OSError:
                pass  # the client is gone already
            conn.close()
            conn = None
            continue
        try:
            newcomer = _pump(listener, conn, port, protocol_for(conn, port), stop_fd)
        finally:
            port.close()
            conn.close()
        if newcomer is STOPPED:
            return
        conn = newcomer


def start_bridge(host, resource, lease, device: str, baud: int, framing: str = "8N1", rfc2217: bool = False,
                 in_thread: bool = False, role: str = EndpointRole.CONSOLE) -> Service:
    """Serve ``device`` on a free port of ``host`` for ``lease``: one endpoint, raw or RFC 2217,
    a ``console`` unless ``role`` says otherwise.

    ``in_thread``: as a thread of the exporter rather than a process of its own (for
    the simulated boards, whose consoles live in the exporter too).
    """
    protocol, params = "rfc2217" if rfc2217 else "raw", {"baud": baud, "framing": framing}
    if in_thread:
        return host.serve_in_thread(lambda listener, stop_fd: serve(listener, device, baud, framing, rfc2217, stop_fd),
                                    resource, lease, name="bridge", protocol=protocol, params=params,
                                    command=CONSOLE_COMMAND, role=role)
    argv = [*python_module("device_loop.core.serial_bridge"), "--fd", "{fd}", "--device", device,
            "--baud", str(baud), "--framing", framing] + (["--rfc2217"] if rfc2217 else [])
    return host.serve_on_free_port(argv, resource, lease, name="bridge", protocol=protocol, params=params,
                                   command=CONSOLE_COMMAND, role=role)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="inherited listening socket")
    parser.add_argument("--device", required=True)
    parser.add_argument("--baud", type=int, default=115200)
    parser.add_argument("--framing", default="8N1")
    parser.add_argument("--rfc2217", action="store_true", help="speak telnet with RFC 2217, not raw bytes")
    args = parser.parse_args()
    serve(inherited_listener(args.fd), args.device, args.baud, args.framing, args.rfc2217)


if __name__ == "__main__":
    main()
