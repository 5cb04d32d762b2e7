"""``device-loop console``: a terminal on a leased device's UART.

Speaks RFC 2217 (pyserial's ``rfc2217://``) to the lease's UART endpoint, so ``--baud``
changes the board's line speed remotely; a raw endpoint (simulated boards) is plain TCP.
Interactive on a terminal (Ctrl-] leaves); with input from a pipe it sends the input,
prints what the board answers for ``--timeout`` seconds, and exits.
"""
from __future__ import annotations

import os
import select
import signal
import sys
import termios
import threading
import time
import tty

import click
import serial

from device_loop.core import LIVE_LEASE_STATES
from device_loop.core.gate import LocalForward
from device_loop.core.uart_client import open_uart
from device_loop.core.usage import EndpointJSON, by_role, out_of_scope
from device_loop.core.vocabulary import EndpointRole

from .commands import _my_lease, json_option, lab_command
from device_loop.client.http import CoordinatorError
from device_loop.client.lab import Lab
from device_loop.core.errors import ErrorCode
from .output import fail

ESCAPE = b"\x1d"  # Ctrl-], as in telnet
ENDED_AS = {"expired": "expired", "released": "was released", "revoked": "was revoked", "failed": "failed"}


def how_it_ended(lease: dict) -> str:
    """A lease that is over, in words: how it ended (its state) and why, and what to do."""
    why = "" if lease["state"] == "expired" else f" ({lease['reason']})"  # (an expiry's reason says it again)
    return (f"your lease {lease['id']} on {lease['device']} {ENDED_AS.get(lease['state'], 'ended')} at "
            f"{lease['ended_at']}{why}; to go on: device-loop reserve {lease['device']}")


def uart_endpoint(lease) -> EndpointJSON:
    """The lease's serial console (its ``console`` endpoint), RFC 2217 first."""
    if lease.state not in LIVE_LEASE_STATES:
        raise CoordinatorError(ErrorCode.LEASE_ENDED, how_it_ended(lease.data))
    endpoints = by_role(lease.data, EndpointRole.CONSOLE)
    if endpoints:
        return min(endpoints, key=lambda e: e.get("protocol") != "rfc2217")
    if withheld := out_of_scope(lease.data, "uart", "console"):
        raise CoordinatorError(ErrorCode.OUT_OF_SCOPE, withheld)
    if not lease.data["ready"]:
        raise CoordinatorError(ErrorCode.NOT_READY, f"{lease.data['device']} is not ready: {lease.data['reason']}")
    raise CoordinatorError(ErrorCode.NO_UART, f"{lease.data['device']} has no UART")


def _pump_to(out, port, log, stop: threading.Event, lost: threading.Event) -> None:
    while not stop.is_set():
        try:
            data = port.read(4096)
        except (serial.SerialException, OSError):
            lost.set()
            stop.set()
            return
        if data:
            out.write(data)
            out.flush()
            if log:
                log.write(data)


def _interactive(port, log) -> bool:
    """Until Ctrl-]; False if the connection was lost. The terminal is restored however
    it ends (SIGTERM and SIGHUP included)."""
    stop, lost = threading.Event(), threading.Event()
    reader = threading.Thread(target=_pump_to, args=(sys.stdout.buffer, port, log, stop, lost), daemon=True)
    saved = termios.tcgetattr(sys.stdin)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_, sig=sig: sys.exit(128 + sig))
    tty.setraw(sys.stdin, termios.TCSANOW)  # (TCSAFLUSH would drop what was typed since the banner)
    reader.start()
    try:
        while not stop.is_set():
            ready, _, _ = select.select([sys.stdin], [], [], 0.2)
            if ready:
                data = os.read(sys.stdin.fileno(), 1024)
                if not data or ESCAPE in data:
                    break
                port.write(data)
    except (serial.SerialException, OSError):
        lost.set()
    finally:
        stop.set()
        termios.tcsetattr(sys.stdin, termios.TCSADRAIN, saved)
        reader.join(1)
    return not lost.is_set()


def _batch(port, log, timeout: float) -> bool:
    """Send stdin as it comes, print what comes back; end ``timeout`` s after the last
    input (or its end), even if stdin stays open. False if the connection was lost."""
    stop, lost = threading.Event(), threading.Event()
    reader = threading.Thread(target=_pump_to, args=(sys.stdout.buffer, port, log, stop, lost), daemon=True)
    reader.start()
    deadline, stdin_open = time.monotonic() + timeout, True
    try:
        while not lost.is_set() and time.monotonic() < deadline:
            if stdin_open and select.select([sys.stdin], [], [], min(0.1, timeout))[0]:
                data = os.read(sys.stdin.fileno(), 65536)
                stdin_open = bool(data)
                port.write(data)
                deadline = time.monotonic() + timeout
            elif not stdin_open:
                lost.wait(max(0.0, deadline - time.monotonic()))
    except (serial.SerialException, OSError):
        lost.set()
    stop.set()
    reader.join(1)
    return not lost.is_set()


@click.command("console")
@click.argument("target", metavar="DEVICE|LEASE")
@click.option("--log", "log_path", type=click.Path(dir_okay=False),
              help="also append what the board prints to this file")
@click.option("--baud", type=click.IntRange(50, 10_000_000), help="change the line speed (RFC 2217)")
@click.option("--timeout", default=2.0, show_default=True, type=click.FloatRange(0, 3600),
              help="with piped input: seconds to wait for the answer")
@json_option
@lab_command
def console_command(lab: Lab, target: str, log_path: str | None, baud: int | None, timeout: float, as_json: bool):
    """A terminal on the UART of your lease (Ctrl-] leaves)."""
    lease = _my_lease(lab, target)
    device, endpoint = lease.data["device"], uart_endpoint(lease)
    if secret := endpoint.get("secret"):  # a gated endpoint: speak its handshake through a local port
        endpoint = LocalForward(endpoint, secret).endpoint  # for as long as the console runs
    where = f"{endpoint['host']}:{endpoint['port']}"
    if baud and endpoint.get("protocol") != "rfc2217":
        click.echo(f"device-loop: {device}'s UART is raw TCP: --baud needs RFC 2217 and is ignored", err=True)
    threading.excepthook = lambda args: None  # pyserial's reader thread reports what we report below
    try:
        port = open_uart(endpoint, baud)
    except (serial.SerialException, OSError, ValueError) as exc:
        busy = isinstance(exc, BrokenPipeError) or "Broken pipe" in str(exc)
        fail(as_json, "busy" if busy else "unreachable",
             f"the UART of {device} is in use by another client" if busy
             else f"cannot open the UART of {device} at {where}: {exc}")
    log = open(log_path, "ab") if log_path else None
    try:
        if sys.stdin.isatty():
            click.echo(f"connected to {device} ({where}, {port.baudrate} baud); Ctrl-] leaves", err=True)
            kept = _interactive(port, log)
        else:
            kept = _batch(port, log, timeout)
    finally:
        port.close()
        if log:
            log.close()
    if not kept:
        ended = _ended_meanwhile(lease)
        fail(as_json, "lease_ended" if ended else "connection_lost",
             f"the connection to {device}'s UART was closed: {ended}" if ended else
             f"the connection to {device}'s UART was lost (unplugged, its exporter stopped, or another client "
             "took over)")


def _ended_meanwhile(lease) -> str | None:
    """How the lease ended, if that is why its UART went away."""
    try:
        lease.refresh()
    except CoordinatorError:
        return None
    return None if lease.state in LIVE_LEASE_STATES else how_it_ended(lease.data)
