"""A stand-in for adb from platform-tools 35, which knows ``--one-device`` (Debian's adb 29,
installed for the tests, does not). Only what the plugin uses, and never more lenient than
the real one: the server takes a moment before it listens, and after ``kill-server``
returns the old server still holds its port for a while, so a caller that does not wait
for the port is caught. Every call is appended to ``$FAKE_ADB_LOG``, with whether the
global server's port was free at that moment.

Its server speaks enough of adb's host protocol for the real adb client (Debian's) to run
``adb -s SERIAL shell CMD`` through it: ``host:version`` (41, the client's own, or it
would restart the server), the phone's features (``shell_v2``), the switch to the phone's
transport (only the ``--one-device`` phone: any other serial is "not found"), and the shell
protocol v2 as adbd speaks it: the command run by ``sh -c`` (here, the phone's shell being
this machine's), its stdout and stderr in packets of their own, then its exit status (a
signal's as 128 + its number), the command hung up on (SIGHUP) if the client goes away."""
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

args = sys.argv[1:]
global_port = int(os.environ.get("ANDROID_ADB_SERVER_PORT", 5037))


def port_free(port: int) -> bool:
    try:
        socket.create_server(("127.0.0.1", port)).close()
        return True
    except OSError:
        return False


with open(os.environ["FAKE_ADB_LOG"], "a") as log:  # with what a server would find at its start
    log.write(json.dumps({"args": args, "global_port_free": port_free(global_port)}) + "\n")

if "--help" in args or args[:1] == ["help"]:
    print("Android Debug Bridge version 1.0.41\nVersion 35.0.2-12147458\n\nglobal options:\n"
          " -a                       listen on all network interfaces, not just localhost\n"
          " -P                       port of adb server [default=5037]\n"
          " -L SOCKET                listen on given socket for adb server [default=tcp:localhost:5037]\n"
          " --one-device SERIAL|USB  only allowed with 'start-server' or 'server nodaemon', server will"
          " only connect to one USB device, specified by a serial number or USB device address.")
    sys.exit(0)

port = int(args[args.index("-P") + 1]) if "-P" in args else global_port
# -L localfilesystem:PATH: the server's unix socket (as adb's own: it fails if the path is taken)
where = args[args.index("-L") + 1] if "-L" in args else None
if where is not None and not where.startswith(("localfilesystem:", "tcp:")):
    print(f"fake adb: -L {where} is not faked", file=sys.stderr)
    sys.exit(1)
unix_path = where.removeprefix("localfilesystem:") if where and where.startswith("localfilesystem:") else None
if where and where.startswith("tcp:"):
    port = int(where.rsplit(":", 1)[1])

SERVER_VERSION = 41  # what Debian's adb 29 client asks for
FEATURES = "shell_v2,cmd,stat_v2,ls_v2,fixed_push_mkdir,apex,abb,fixed_push_symlink_timestamp,abb_exec"
STDIN, STDOUT, STDERR, EXIT, CLOSE_STDIN = 0, 1, 2, 3, 4  # shell v2's packet ids


def framed(text: str) -> bytes:
    data = text.encode()
    return b"%04x" % len(data) + data


def read_exactly(conn, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def read_request(conn) -> str | None:
    head = read_exactly(conn, 4)
    body = read_exactly(conn, int(head, 16)) if head else None
    return body.decode(errors="replace") if body is not None else None


def shell_v2(conn, command: str) -> None:
    """adbd's shell protocol v2 for one command: stdout and stderr packets, then the exit status."""
    proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    sending = threading.Lock()

    def send(packet_id: int, data: bytes) -> None:
        with sending:
            conn.sendall(struct.pack("<BI", packet_id, len(data)) + data)

    def pump(stream, packet_id: int) -> None:
        try:
            while chunk := os.read(stream.fileno(), 65536):
                send(packet_id, chunk)
        except OSError:  # the client went away
            pass

    def from_client() -> None:
        try:
            while (head := read_exactly(conn, 5)) is not None:
                packet_id, size = struct.unpack("<BI", head)
                data = read_exactly(conn, size) if size else b""
                if packet_id == STDIN and data:
                    proc.stdin.write(data)
                    proc.stdin.flush()
                elif packet_id == CLOSE_STDIN:
                    proc.stdin.close()
        except OSError:  # the connection is closed: the command has ended
            return
        if proc.poll() is None:  # the client hung up: so does the phone's shell
            try:
                os.killpg(proc.pid, signal.SIGHUP)
            except ProcessLookupError:
                pass

    pumps = [threading.Thread(target=pump, args=(proc.stdout, STDOUT)),
             threading.Thread(target=pump, args=(proc.stderr, STDERR))]
    for thread in pumps + [threading.Thread(target=from_client, daemon=True)]:
        thread.start()
    status = proc.wait()
    for thread in pumps:
        thread.join()
    try:
        send(EXIT, bytes([status if status >= 0 else 128 - status]))
    except OSError:
        pass


def serve(conn, serial: str | None) -> None:
    """One connection of a client: host requests, or a switch to the phone and then its service."""
    with conn:
        while (request := read_request(conn)) is not None:
            if request == "host:kill":
                conn.sendall(b"OKAY")
                conn.close()
                time.sleep(0.5)  # the port stays taken a while after kill-server returned
                os._exit(0)
            if request == "host:version":
                conn.sendall(b"OKAY" + framed("%04x" % SERVER_VERSION))
                return
            asked = (request.removeprefix("host:transport:").removeprefix("host:tport:serial:")
                     .removeprefix("host-serial:").removesuffix(":features"))
            if request.startswith(("host:transport:", "host:tport:serial:", "host-serial:")) and asked != serial:
                conn.sendall(b"FAIL" + framed(f"device '{asked}' not found"))
                return
            if request.endswith("features"):
                conn.sendall(b"OKAY" + framed(FEATURES))
                return
            if request.startswith("host:transport:"):
                conn.sendall(b"OKAY")
                continue  # the next request is the phone's
            if request.startswith("host:tport:"):
                conn.sendall(b"OKAY" + struct.pack("<Q", 1))
                continue
            if request.startswith("shell,v2,") and ":" in request:
                conn.sendall(b"OKAY")
                shell_v2(conn, request.split(":", 1)[1])
                conn.shutdown(socket.SHUT_RDWR)  # (the thread reading the client's packets holds it too)
                return
            conn.sendall(b"OKAY0000")  # an empty device list for anything else
            return


if "server" in args and "nodaemon" in args:
    time.sleep(0.3)  # a real server needs a moment before it listens
    if unix_path is not None:
        server = socket.socket(socket.AF_UNIX)
        server.bind(unix_path)
        server.listen(16)
    else:
        server = socket.create_server(("0.0.0.0" if "-a" in args else "127.0.0.1", port))
    phone = args[args.index("--one-device") + 1] if "--one-device" in args else None
    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn, phone), daemon=True).start()

if "kill-server" in args:
    if unix_path is not None:
        reach = socket.socket(socket.AF_UNIX)
        reach.settimeout(5)
        reach.connect(unix_path)
    else:
        reach = socket.create_connection(("127.0.0.1", port), timeout=5)
    with reach as conn:
        conn.sendall(b"0009host:kill")
        conn.recv(4)
    sys.exit(0)

print(f"fake adb: {args} is not faked", file=sys.stderr)
sys.exit(1)
