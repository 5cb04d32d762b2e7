"""A TCP <-> serial bridge process: ``python -m device_loop.core.serial_bridge``.

Serves a serial device raw, or over telnet with RFC 2217 (so a remote client can change
the baud rate), the two modes ser2net offers. Used for the simulated boards, and for
real UARTs where ser2net is not installed. The listening socket is inherited from the
exporter (``--fd``), so the endpoint accepts the moment this process exists.

The bridge opens its device when a client connects (dropping what the device printed
before: a newcomer gets no backlog) and closes it when the client leaves: with nobody
connected nobody holds the node, so a plugin's operation or the exporter's power watch may
read it. While it runs, it keeps a record of what it saw (``console_activity.py``: bytes
printed and typed, when, hang-ups, whether it holds the node open) for the power operation.
While a client is connected and the device hangs up or vanishes (a board powered off, a USB
adapter unplugged), or its node goes or names another device (checked every
``NODE_CHECK_S``), the bridge closes it and looks for it again every ``REOPEN_S``; the
client stays connected meanwhile (what it types is dropped) and sees the board again once
the device is back, a boot banner after a power cycle (a reopen keeps what the device
printed). A client that connects while the device cannot be opened is told
``device open failure: REASON`` once, and stays. A new client takes over from the previous
one (``kickolduser``), the device staying open.
"""
from __future__ import annotations

import argparse
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import serial
from serial.rfc2217 import PortManager

from .console_activity import ActivityWriter, record_path
from .model import Service
from .ports import inherited_listener
from .process import python_module
from .vocabulary import EndpointRole

if TYPE_CHECKING:
    from .host import HostContext
    from .model import LeaseRef, Resource

#: How a person uses a serial console endpoint (it speaks the lease gate where there is one).
CONSOLE_COMMAND = "device-loop console {lease}"
REOPEN_S = 0.1  # a device that hung up or vanished is looked for again this often
NODE_CHECK_S = 0.5  # how often the node of an open device is looked at (still there, still the same?)
FRAMING = {"N": serial.PARITY_NONE, "E": serial.PARITY_EVEN, "O": serial.PARITY_ODD}


def parse_framing(text: str) -> dict:
    """``8N1`` -> pyserial's bytesize, parity, stopbits."""
    if len(text) != 3 or text[0] not in "5678" or text[1].upper() not in FRAMING or text[2] not in "12":
        raise ValueError(f"framing must look like 8N1, not {text!r}")
    return {"bytesize": int(text[0]), "parity": FRAMING[text[1].upper()], "stopbits": int(text[2])}


class _Port(serial.Serial):
    """A serial port whose modem lines may not exist (a pty has none): setting them is a
    no-op and reading them says 'low', instead of failing the RFC 2217 session. The same
    while it is closed (its device away): the session lives on."""

    def _line(self, name: str) -> bool:
        try:
            return getattr(serial.Serial, name).fget(self)
        except (OSError, serial.SerialException):  # (no modem lines; or the device is away)
            return False

    _keep_input = False

    def open(self, keep_input: bool = False) -> None:
        """``keep_input``: without pyserial's flush of what the device sent before (a device
        that came back: what it printed since it did is its boot, which a client should see)."""
        self._keep_input = keep_input
        try:
            super().open()
        finally:
            self._keep_input = False

    def _reset_input_buffer(self) -> None:
        if not self._keep_input:
            super()._reset_input_buffer()  # type: ignore[misc]  # (private: not in types-pyserial)

    # a client's purge while the device is away (closed) purges nothing
    def reset_input_buffer(self) -> None:
        if self.is_open:
            super().reset_input_buffer()

    def reset_output_buffer(self) -> None:
        if self.is_open:
            super().reset_output_buffer()

    cts = property(lambda self: self._line("cts"))
    dsr = property(lambda self: self._line("dsr"))
    ri = property(lambda self: self._line("ri"))
    cd = property(lambda self: self._line("cd"))

    def _update_dtr_state(self) -> None:
        try:
            super()._update_dtr_state()  # type: ignore[misc]  # (private: not in types-pyserial)
        except OSError:
            pass

    def _update_rts_state(self) -> None:
        try:
            super()._update_rts_state()  # type: ignore[misc]  # (private: not in types-pyserial)
        except OSError:
            pass

    def _update_break_state(self) -> None:
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
    def __init__(self, conn: socket.socket, port: serial.Serial) -> None:
        pass

    @staticmethod
    def from_client(data: bytes) -> bytes:
        return data

    @staticmethod
    def to_client(data: bytes) -> bytes:
        return data


class _Device:
    """The served device: one ``_Port`` object for the bridge's whole life, opened and closed
    again as the device comes and goes (RFC 2217's ``PortManager`` keeps a reference to it)."""

    def __init__(self, device: str, baud: int, framing: str, activity: ActivityWriter | None):
        self.activity = activity
        self.error = "not opened yet"
        self.missing = 0  # how many checks in a row found its node missing
        self.port: _Port | None = None
        try:
            self.port = _Port(None, baud, timeout=0, **parse_framing(framing))
        except (serial.SerialException, ValueError) as exc:
            self.error = str(exc)  # never openable: every client is told why
            return
        self.port.port = device
        self.initial = self.port.get_settings()  # what each new client starts with

    @property
    def is_open(self) -> bool:
        return self.port is not None and self.port.is_open

    def gone(self) -> bool:
        """Whether the open device's node is gone: missing twice in a row (a udev link is
        sometimes made again), or naming another device now (a link pointed elsewhere)."""
        assert self.port is not None and self.port.port is not None and self.port.fd is not None
        try:
            now, ours = os.stat(self.port.port), os.fstat(self.port.fd)
        except OSError:
            self.missing += 1
            return self.missing >= 2
        self.missing = 0
        return (now.st_rdev, now.st_ino, now.st_dev) != (ours.st_rdev, ours.st_ino, ours.st_dev)

    def open(self, flush: bool) -> bool:
        """Try to open it; False (``error`` says why) when it cannot be. ``flush``: drop what
        the device printed before (for a client that just came; not once it came back)."""
        if self.port is None:
            return False
        try:
            self.port.open(keep_input=not flush)
        except (serial.SerialException, OSError, ValueError) as exc:
            self.error = str(exc)
            self._close()
            return False
        self.missing = 0
        if self.activity is not None:
            self.activity.opened()
        return True

    def hang_up(self, why: Exception | str) -> None:
        """It failed (hung up, vanished): closed, to be looked for again."""
        self.error = str(why) or type(why).__name__
        self._close()
        if self.activity is not None:
            self.activity.hung_up()

    def _close(self) -> None:
        if self.port is not None:
            try:
                self.port.close()
            except (serial.SerialException, OSError):
                pass

    def close(self) -> None:
        """Closed because no client is left (not a hang-up)."""
        was_open = self.is_open
        self._close()
        if was_open and self.activity is not None:
            self.activity.closed()

    def fresh_settings(self) -> None:
        """A new client starts at the configured speed and framing, whatever the last one set
        (raises ``SerialException`` or ``OSError`` when the device fails meanwhile)."""
        if self.port is not None:
            self.port.apply_settings(self.initial)


class _Bridge:
    """One bridge's state: the device (open only while a client is connected), the client."""

    def __init__(self, listener: socket.socket, device: _Device,
                 protocol_for: Callable[..., _Telnet | _Raw], stop_fd: int | None) -> None:
        self.listener, self.device, self.protocol_for, self.stop_fd = listener, device, protocol_for, stop_fd
        self.conn: socket.socket | None = None
        self.protocol: _Telnet | _Raw | None = None  # the client's, while there is one
        self.sel = selectors.DefaultSelector()
        self.port_fd: int | None = None  # the device's fd, while it is registered
        self.retry_at = 0.0  # when to look for the device again, while it is closed
        self.check_at = 0.0  # when to look whether its node is still the one open, while it is open

    def run(self) -> None:
        self.sel.register(self.listener, selectors.EVENT_READ, "listener")
        if self.stop_fd is not None:
            self.sel.register(self.stop_fd, selectors.EVENT_READ, "stop")
        try:
            while True:
                now = time.monotonic()
                if self.device.is_open and now >= self.check_at:
                    self.check_at = now + NODE_CHECK_S
                    if self.device.gone():
                        self._device_down(f"{self.device.port.port if self.device.port else 'the device'} is gone")
                if self.conn is not None and not self.device.is_open and now >= self.retry_at:
                    self._reopen(flush=False)  # (what it printed since it came back is for the client)
                if self.device.is_open:
                    timeout: float | None = max(0.0, self.check_at - time.monotonic())
                elif self.conn is not None:
                    timeout = max(0.0, self.retry_at - time.monotonic())
                else:
                    timeout = None  # nobody connected: the device stays closed, nothing to look at
                for key, _ in self.sel.select(timeout):
                    if key.data == "stop":
                        return
                    if key.data == "listener":
                        self._take_over()
                    # (an event of a client or a device fd that an earlier event of this batch replaced is stale)
                    elif key.data == "client" and key.fileobj is self.conn:
                        self._from_client()
                    elif key.data == "serial" and key.fd == self.port_fd:
                        self._from_device()
        finally:
            self._drop_client()
            self._device_down(None)
            self.sel.close()

    # ---- the device --------------------------------------------------------------------------

    def _reopen(self, flush: bool) -> bool:
        if self.device.open(flush):
            assert self.device.port is not None
            self.port_fd = self.device.port.fileno()
            self.sel.register(self.port_fd, selectors.EVENT_READ, "serial")
            self.check_at = time.monotonic() + NODE_CHECK_S
            return True
        self.retry_at = time.monotonic() + REOPEN_S
        return False

    def _device_down(self, why: Exception | str | None) -> None:
        if self.port_fd is not None:
            self.sel.unregister(self.port_fd)
            self.port_fd = None
        if why is None:
            self.device.close()
        else:
            self.device.hang_up(why)
            self.retry_at = time.monotonic() + REOPEN_S

    def _from_device(self) -> None:
        assert self.device.port is not None
        try:
            data = self.device.port.read(65536)
        except (serial.SerialException, OSError) as exc:
            self._device_down(exc)
            return
        if not data:
            return
        if self.device.activity is not None:
            self.device.activity.printed(len(data))
        if self.conn is not None and self.protocol is not None:  # (there is one while it is open)
            try:
                self.conn.sendall(self.protocol.to_client(data))
            except OSError:
                self._drop_client()

    # ---- the client --------------------------------------------------------------------------

    def _take_over(self) -> None:
        try:
            newcomer, _ = self.listener.accept()
        except OSError:
            return  # it gave up before we took it
        self._drop_client(keep_device=True)  # (the device stays open for the newcomer)
        self.conn = newcomer
        if self.device.activity is not None:
            self.device.activity.client(True)
        try:  # (on a closed port: what its open will set)
            self.device.fresh_settings()
        except (serial.SerialException, OSError) as exc:  # it failed just now: looked for again
            self._device_down(exc)
        if not self.device.is_open and not self._reopen(flush=True):
            try:
                newcomer.sendall(f"device open failure: {self.device.error}\r\n".encode())
            except OSError:
                self._drop_client()
                return
        try:
            self.protocol = self.protocol_for(newcomer, self.device.port)
        except OSError:  # (telnet's first requests could not be sent: it is gone)
            self._drop_client()
            return
        self.sel.register(newcomer, selectors.EVENT_READ, "client")

    def _from_client(self) -> None:
        assert self.conn is not None and self.protocol is not None
        try:
            data = self.conn.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._drop_client()
            return
        try:
            data = self.protocol.from_client(data)  # (telnet answers as it reads: also while the device is away)
        except OSError:
            self._drop_client()
            return
        except serial.SerialException as exc:  # (a purge or a modem line on a device that just failed)
            self._device_down(exc)
            return
        if data and self.device.is_open:
            assert self.device.port is not None
            try:
                written = self.device.port.write(data)
            except (serial.SerialException, OSError) as exc:
                self._device_down(exc)
                return
            if written and self.device.activity is not None:
                self.device.activity.typed(written)
        # else: typed at a device that is not there, and dropped, as on a wire

    def _drop_client(self, keep_device: bool = False) -> None:
        """The client is gone (or taken over from): the device is closed unless ``keep_device``
        (nobody is left to read it, and another program may want the node)."""
        if self.conn is not None:
            try:
                self.sel.unregister(self.conn)
            except (KeyError, ValueError):
                pass  # (not registered yet)
            self.conn.close()
            self.conn = self.protocol = None
        if not keep_device:
            if self.device.activity is not None:
                self.device.activity.client(False)
            self._device_down(None)


def serve(listener: socket.socket, device: str, baud: int, framing: str, rfc2217: bool,
          stop_fd: int | None = None, activity_path: str | Path | None = None) -> None:
    """Serve ``device`` to clients one after another (a newcomer takes over) until ``stop_fd``
    is readable, holding it open while one is connected (``activity_path``: where to record
    what it prints and what they type)."""
    activity = ActivityWriter(Path(activity_path)) if activity_path is not None else None
    try:
        _Bridge(listener, _Device(device, baud, framing, activity), _Telnet if rfc2217 else _Raw, stop_fd).run()
    finally:
        if activity is not None:
            activity.close()


def start_bridge(host: HostContext, resource: Resource, lease: LeaseRef, device: str, baud: int, framing: str = "8N1",
                 rfc2217: bool = False, in_thread: bool = False, role: str = EndpointRole.CONSOLE) -> Service:
    """Serve ``device`` on a free port of ``host`` for ``lease``: one endpoint, raw or RFC 2217,
    a ``console`` unless ``role`` says otherwise. The bridge records what the device prints at
    ``record_path(host.state_dir, resource.identifier)`` while it runs.

    ``in_thread``: as a thread of the exporter rather than a process of its own (for
    the simulated boards, whose consoles live in the exporter too).
    """
    protocol, params = "rfc2217" if rfc2217 else "raw", {"baud": baud, "framing": framing}
    activity = record_path(host.state_dir, resource.identifier)
    if in_thread:
        return host.serve_in_thread(
            lambda listener, stop_fd: serve(listener, device, baud, framing, rfc2217, stop_fd, activity),
            resource, lease, name="bridge", protocol=protocol, params=params, command=CONSOLE_COMMAND, role=role)
    argv = [*python_module("device_loop.core.serial_bridge"), "--fd", "{fd}", "--device", device,
            "--baud", str(baud), "--framing", framing, "--activity", str(activity)] + (["--rfc2217"] if rfc2217 else [])
    return host.serve_on_free_port(argv, resource, lease, name="bridge", protocol=protocol, params=params,
                                   command=CONSOLE_COMMAND, role=role)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="inherited listening socket")
    parser.add_argument("--device", required=True)
    parser.add_argument("--baud", type=int, default=115200)
    parser.add_argument("--framing", default="8N1")
    parser.add_argument("--rfc2217", action="store_true", help="speak telnet with RFC 2217, not raw bytes")
    parser.add_argument("--activity", help="where to record what the device prints (console_activity.py)")
    args = parser.parse_args()
    # stopped with SIGTERM (ProcessRegistry): unwind, so that the record is removed
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    serve(inherited_listener(args.fd), args.device, args.baud, args.framing, args.rfc2217,
          activity_path=args.activity)


if __name__ == "__main__":
    main()
