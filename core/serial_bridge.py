"""A raw TCP <-> serial bridge process: ``python -m device_loop.core.serial_bridge``.

Used where ser2net is not the server (the simulated boards). Like ser2net it opens the
serial device for each client, so a device that vanishes and comes back is picked up
again, and a new client takes over from the previous one (``kickolduser``).
The listening socket is inherited from the exporter (``--fd``), so the endpoint is
ready the moment this process exists.
"""
import argparse
import selectors
import socket
import sys

import serial

from .model import Service


def _open(device: str, baud: int):
    port = serial.Serial(device, baud, timeout=0)
    port.reset_input_buffer()
    return port


def _pump(listener: socket.socket, conn: socket.socket, port) -> socket.socket | None:
    """Copy bytes both ways until one side closes; return a new client if one took over."""
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "listener")
    sel.register(conn, selectors.EVENT_READ, "client")
    sel.register(port.fileno(), selectors.EVENT_READ, "serial")
    try:
        while True:
            for key, _ in sel.select():
                if key.data == "listener":
                    newcomer, _ = listener.accept()
                    return newcomer
                if key.data == "client":
                    data = conn.recv(65536)
                    if not data:
                        return None
                    port.write(data)
                else:
                    try:
                        data = port.read(65536)
                    except serial.SerialException:
                        return None
                    if data:
                        conn.sendall(data)
    except OSError:
        return None
    finally:
        sel.close()


def serve(listener: socket.socket, device: str, baud: int) -> None:
    conn = None
    while True:
        if conn is None:
            conn, _ = listener.accept()
        try:
            port = _open(device, baud)
        except (serial.SerialException, OSError) as exc:
            conn.sendall(f"device open failure: {exc}\r\n".encode())
            conn.close()
            conn = None
            continue
        try:
            newcomer = _pump(listener, conn, port)
        finally:
            port.close()
            conn.close()
        conn = newcomer


def start_bridge(host, resource, lease, device: str, baud: int) -> Service:
    """Serve ``device`` on a free port of ``host`` for ``lease``: one raw TCP endpoint."""
    argv = [sys.executable, "-m", "device_loop.core.serial_bridge", "--fd", "{fd}", "--device", device, "--baud", str(baud)]
    return host.serve_on_free_port(argv, resource, lease, name="bridge")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="inherited listening socket")
    parser.add_argument("--device", required=True)
    parser.add_argument("--baud", type=int, default=115200)
    args = parser.parse_args()
    listener = socket.socket(fileno=args.fd)
    serve(listener, args.device, args.baud)


if __name__ == "__main__":
    main()
