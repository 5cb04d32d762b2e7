"""device-loop plugin ``bootlog``: the operation ``capture-boot-log``.

It resets a board through its serial console (a command such as ``reboot\\r`` sent on the
line, and/or a pulse of DTR where DTR is wired to the board's reset) and returns what the
console printed in the next ``seconds``: the boot log, its line count and a sentence.

It serves no lease (a resource of kind ``bootlog`` with ``serves_lease=False``): it is
reached only through the operation, which the holder of the device's lease starts
(``device-loop op run capture-boot-log DEVICE --arg seconds=10``). Exporter config, one
entry beside the device's console::

    [[devices]]
    name = "jupiter"
    class = "riscv-sbc"

    [[devices.resources]]
    plugin = "uart"
    path = "/dev/serial/by-id/usb-FTDI_FT232R_USB_UART_A10K3XYZ-if00-port0"

    [[devices.resources]]
    plugin = "bootlog"
    path = "/dev/serial/by-id/usb-FTDI_FT232R_USB_UART_A10K3XYZ-if00-port0"
    reset_command = "reboot\\r"      # and/or: pulse_dtr = true

The console is a single reader's: two readers of one tty split its bytes between them.
So the operation is *exclusive* (the coordinator runs one at a time on a device and grants
no lease meanwhile), it refuses to start while another process has the tty open (close
``device-loop console`` first), and while it captures it holds the tty with ``TIOCEXCL``
so that a console opened meanwhile is refused rather than handed half of the bytes (root
is exempt from ``TIOCEXCL``). See README.md.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
import termios
import time

import serial
from pydantic import Field, model_validator

from device_loop.plugin import Health, OperationError, OperationKind, PluginConfig, command_of, holders, hookimpl

KIND = "capture-boot-log"
RESOURCE_KIND = "bootlog"
MAX_READ_BYTES = 1 << 20  # what one capture keeps of the console at most (the rest is counted)
MAX_LOG_JSON = 60_000     # the log in the result, as JSON (a result takes 64 KiB at most)
READ_TICK_S = 0.1         # how long one read waits for bytes


class BootlogConfig(PluginConfig):
    """One board's console, and how to reset the board through it."""

    path: str = Field(min_length=1, description="the console's tty: /dev/serial/by-id/..., or a simulated "
                                                "board's pty (the sim plugin links it at STATE_DIR/sim/DEVICE)")
    baud: int = Field(default=115200, gt=0, description="the console's speed")
    reset_command: str = Field(default="", max_length=256,
                               description='sent on the console to reset the board, e.g. "reboot\\r" (empty: none)')
    pulse_dtr: bool = Field(default=False, description="drop DTR for dtr_pulse_s, then raise it (DTR wired to reset)")
    dtr_pulse_s: float = Field(default=0.2, gt=0, le=5, description="how long DTR is dropped")
    default_seconds: float = Field(default=5, gt=0, le=600, description="how long a capture lasts when not told")
    max_seconds: float = Field(default=60, gt=0, le=600, description="the longest capture anyone may ask for")

    @model_validator(mode="after")
    def _resets_the_board(self):
        if not self.reset_command and not self.pulse_dtr:
            raise ValueError('say how the board is reset: reset_command = "reboot\\r", pulse_dtr = true, or both')
        if self.default_seconds > self.max_seconds:
            raise ValueError(f"default_seconds ({self.default_seconds:g}) is above max_seconds "
                             f"({self.max_seconds:g})")
        return self


def _how(config: BootlogConfig) -> str:
    """How the board is reset, in words."""
    said = [f"pulse DTR for {config.dtr_pulse_s:g} s"] if config.pulse_dtr else []
    said += [f"send {config.reset_command!r}"] if config.reset_command else []
    return " and ".join(said)


@hookimpl
def devloop_config_model():
    return BootlogConfig


@hookimpl
def devloop_available(host):
    return None  # pyserial comes with device-loop


@hookimpl
def devloop_discover(host):
    # configured entries only, and read-only: the tty is opened by the operation, never here
    return [dataclasses.replace(entry.resource(RESOURCE_KIND, f"bootlog:{host.name}:{entry.device}"),
                                serves_lease=False)
            for entry in host.entries]


@hookimpl
def devloop_health(resource):
    path = resource.config.path
    if not os.path.exists(path):
        # the board itself may be fine (its other resources say): only a capture cannot work
        return Health("degraded", f"console {path} is not there: capture-boot-log cannot run")
    if not os.access(path, os.R_OK | os.W_OK):
        return Health("degraded", f"console {path} is not readable and writable by the exporter")
    return Health("ok")


@hookimpl
def devloop_operations(resource):
    config = resource.config
    return [OperationKind(
        KIND, f"reset the board ({_how(config)}) and return what its console prints next: its boot log",
        args={"seconds": f"how long to capture after the reset, in seconds: {config.default_seconds:g} unless "
                         f"told, at most {config.max_seconds:g}",
              "until": "stop as soon as this text shows up, say 'login:'; never later than `seconds`"},
        exclusive=True, destructive=False)]


@hookimpl
def devloop_operate(resource, op):
    if op.kind != KIND:
        raise OperationError(f"bootlog runs {KIND!r}, not {op.kind!r}", changed=False)
    config = resource.config
    seconds, until = _checked_args(op.args, config)
    path = config.path
    others = _others_holding(path)
    if others:
        raise OperationError(f"the console {path} is open in {'; '.join(others)}: a capture needs it alone (two "
                             "readers split its bytes). Close that console (device-loop console) and run it again",
                             changed=False)
    try:
        port = serial.Serial(path, config.baud, timeout=READ_TICK_S, write_timeout=2)
    except (serial.SerialException, OSError, ValueError) as exc:
        raise OperationError(f"cannot open the console {path}: {exc}", changed=False) from None
    exclusive = _set_exclusive(port, True)
    try:
        return _capture(port, config, op, seconds, until)
    finally:
        if exclusive:
            _set_exclusive(port, False)  # a pty stays open on its board's side: the mark would outlive us
        port.close()


def _checked_args(args: dict, config: BootlogConfig) -> tuple[float, bytes | None]:
    """``seconds`` (a number, or a text that reads as one) and ``until``; refused otherwise."""
    unknown = sorted(set(args) - {"seconds", "until"})
    if unknown:
        raise OperationError(f"{KIND} takes seconds and until, not {', '.join(unknown)}", changed=False)
    seconds = args.get("seconds")
    if seconds is None:
        seconds = config.default_seconds
    else:
        shown = seconds
        try:
            if isinstance(seconds, bool):
                raise ValueError
            seconds = float(seconds.strip() if isinstance(seconds, str) else seconds)
        except (TypeError, ValueError):
            seconds = math.nan
        if not (math.isfinite(seconds) and 0 < seconds <= config.max_seconds):
            raise OperationError(f"seconds must be a number above 0 and at most {config.max_seconds:g}, not "
                                 f"{shown!r}", changed=False)
    until = args.get("until")
    if until is not None and (not isinstance(until, str) or not 0 < len(until) <= 256):
        raise OperationError(f"until must be a text of 1 to 256 characters, not {until!r}", changed=False)
    return seconds, until.encode() if until else None


def _capture(port: serial.Serial, config: BootlogConfig, op, seconds: float, until: bytes | None) -> dict:
    port.reset_input_buffer()  # what the console said before the reset is not this boot's
    op.progress("resetting")
    began = False
    try:
        if config.pulse_dtr:
            port.dtr = False
            began = True
            time.sleep(config.dtr_pulse_s)
            port.dtr = True
        if config.reset_command:
            began = True
            port.write(config.reset_command.encode())
            port.flush()
    except (serial.SerialException, OSError) as exc:
        raise OperationError(f"could not {_how(config)} on {config.path}: {exc}"
                             + (" (a pty has no DTR line)" if config.pulse_dtr else ""), changed=began) from None
    total = math.ceil(seconds)
    op.progress("capturing", 0, total, "seconds")
    kept, seen, stopped = bytearray(), 0, ""
    start = time.monotonic()
    shown = 0
    while (elapsed := time.monotonic() - start) < seconds:
        try:
            data = port.read(4096)
        except (serial.SerialException, OSError) as exc:
            raise OperationError(f"the console {config.path} failed {elapsed:.1f} s into the capture: {exc}") from None
        if data:
            seen += len(data)
            kept += data[:MAX_READ_BYTES - len(kept)]
            if until and until in kept[-(len(data) + len(until)):]:
                stopped = f", up to {until.decode(errors='replace')!r}"
                break
        if int(elapsed) > shown:
            shown = int(elapsed)
            op.progress("capturing", min(shown, total), total, "seconds")
    elapsed = time.monotonic() - start
    if not seen:
        raise OperationError(f"the console {config.path} said nothing in {elapsed:.1f} s after the reset "
                             f"({_how(config)}): is the board powered, is {config.baud} its baud rate, and is no "
                             "console attached through the exporter (it would take the bytes)?")
    op.progress("capturing", total, total, "seconds")
    text = kept.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n").replace("\0", "")
    lines = len(text.splitlines())
    log, cut = _bounded(text)
    said = f"captured {lines} lines ({seen} bytes) in {elapsed:.1f} s after the reset ({_how(config)}){stopped}"
    if cut or seen > len(kept):
        said += "; the log was cut to fit the result"
    return {"log": log, "lines": lines, "bytes": seen, "captured_s": round(elapsed, 2), "truncated": cut,
            "reset": _how(config), "message": said}


def _bounded(text: str) -> tuple[str, bool]:
    """``text``, or its start and its end if it takes more than ``MAX_LOG_JSON`` as JSON."""
    if len(json.dumps(text)) <= MAX_LOG_JSON:
        return text, False
    half = MAX_LOG_JSON // 2
    while True:
        cut = f"{text[:half]}\n[... {len(text) - 2 * half} characters left out ...]\n{text[-half:]}"
        if len(json.dumps(cut)) <= MAX_LOG_JSON:
            return cut, True
        half = half * 3 // 4


def _set_exclusive(port: serial.Serial, on: bool) -> bool:
    """Mark the tty exclusive (a further open fails with EBUSY, but for root), or unmark it."""
    try:
        fcntl.ioctl(port.fileno(), termios.TIOCEXCL if on else termios.TIOCNXCL)
    except OSError:
        return False
    return True


def _others_holding(path: str) -> list[str]:
    """``pid N (command)`` of each other process that has ``path`` open, of those /proc lets us
    see (the exporter's own threads are not told apart: an in-process bridge is not seen)."""
    pids = holders({path}, skip={os.getpid()})[path]
    return [f"pid {pid} ({command_of(pid)[:200]})" for pid in sorted(pids)]
