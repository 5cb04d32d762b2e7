"""``device-loop console``: a terminal on a leased device's UART.

Speaks RFC 2217 (pyserial's ``rfc2217://``) to the lease's UART endpoint, so ``--baud``
changes the board's line speed remotely; a raw endpoint (simulated boards) is plain TCP.
Interactive on a terminal (Ctrl-] leaves); with input from a pipe it sends the input,
prints what the board answers for ``--timeout`` seconds, and exits.
"""
from __future__ import annotations

import os
import select
import sys
import termios
import threading
import time
import tty

import click
import serial

from .commands import _my_lease, json_option, lab_command
from .lab import Lab
from .output import fail

ESCAPE = b"\x1d"  # Ctrl-], as in telnet


def open_uart(endpoint: dict, baud: int | None = None) -> serial.SerialBase:
    """A pyserial port on a UART endpoint, at the device's configured speed unless ``baud``."""
    params = endpoint.get("params") or {}
    speed = baud or int(params.get("baud", 115200))
    if endpoint.get("protocol") == "rfc2217":
        # ser2net on a pty never acknowledges DTR: without this, opening stalls for seconds
        url = f"rfc2217://{endpoint['host']}:{endpoint['port']}?ign_set_control"
    else:
        url = f"socket://{endpoint['host']}:{endpoint['port']}"
    return serial.serial_for_url(url, baudrate=speed, timeout=0.1)


def _uart_endpoint(lease) -> dict:
    endpoints = [e for e in lease.endpoints if e["kind"] == "uart"]
    if not endpoints:
        raise click.ClickException(f"lease {lease.id} has no UART endpoint ({lease.data['reason']})")
    return min(endpoints, key=lambda e: e.get("protocol") != "rfc2217")  # RFC 2217 first


def _pump_to(out, port, log, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            data = port.read(4096)
        except (serial.SerialException, OSError):
            stop.set()
            return
        if data:
            out.write(data)
            out.flush()
            if log:
                log.write(data)


def _interactive(port, log) -> None:
    stop = threading.Event()
    reader = threading.Thread(target=_pump_to, args=(sys.stdout.buffer, port, log, stop), daemon=True)
    saved = termios.tcgetattr(sys.stdin)
    tty.setraw(sys.stdin)
    reader.start()
    try:
        while not stop.is_set():
            ready, _, _ = select.select([sys.stdin], [], [], 0.2)
            if ready:
                data = os.read(sys.stdin.fileno(), 1024)
                if not data or ESCAPE in data:
                    break
                port.write(data)
    finally:
        stop.set()
        termios.tcsetattr(sys.stdin, termios.TCSADRAIN, saved)
        reader.join(1)


def _batch(port, log, timeout: float) -> None:
    port.write(sys.stdin.buffer.read())
    stop = threading.Event()
    reader = threading.Thread(target=_pump_to, args=(sys.stdout.buffer, port, log, stop), daemon=True)
    reader.start()
    time.sleep(timeout)
    stop.set()
    reader.join(1)


@click.command("console")
@click.argument("target", metavar="DEVICE|LEASE")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), help="also write what the board prints here")
@click.option("--baud", type=click.IntRange(50, 10_000_000), help="change the line speed (RFC 2217)")
@click.option("--timeout", default=2.0, show_default=True, type=click.FloatRange(0, 3600),
              help="with piped input: seconds to wait for the answer")
@json_option
@lab_command
def console_command(lab: Lab, target: str, log_path: str | None, baud: int | None, timeout: float, as_json: bool):
    """A terminal on the UART of your lease (Ctrl-] leaves)."""
    lease = _my_lease(lab, target)
    endpoint = _uart_endpoint(lease)
    try:
        port = open_uart(endpoint, baud)
    except (serial.SerialException, OSError, ValueError) as exc:
        fail(as_json, "unreachable", f"cannot open the UART of {lease.data['device']} at "
                                     f"{endpoint['host']}:{endpoint['port']}: {exc}")
    log = open(log_path, "ab") if log_path else None
    try:
        if sys.stdin.isatty():
            click.echo(f"connected to {lease.data['device']} ({endpoint['host']}:{endpoint['port']}, "
                       f"{port.baudrate} baud); Ctrl-] leaves", err=True)
            _interactive(port, log)
        else:
            _batch(port, log, timeout)
    finally:
        port.close()
        if log:
            log.close()
