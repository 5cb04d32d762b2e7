"""A stand-in for adb from platform-tools 35, which knows ``--one-device`` (Debian's adb 29,
installed for the tests, does not). Only what the plugin uses, and never more lenient than
the real one: the server takes a moment before it listens, and after ``kill-server``
returns the old server still holds its port for a while, so a caller that does not wait
for the port is caught. Every call is appended to ``$FAKE_ADB_LOG``, with whether the
global server's port was free at that moment."""
import json
import os
import socket
import sys
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
          " --one-device SERIAL|USB  only allowed with 'start-server' or 'server nodaemon', server will"
          " only connect to one USB device, specified by a serial number or USB device address.")
    sys.exit(0)

port = int(args[args.index("-P") + 1]) if "-P" in args else global_port

if "server" in args and "nodaemon" in args:
    time.sleep(0.3)  # a real server needs a moment before it listens
    server = socket.create_server(("0.0.0.0" if "-a" in args else "127.0.0.1", port))
    while True:
        conn, _ = server.accept()
        request = conn.recv(1024)
        if b"host:kill" in request:
            conn.sendall(b"OKAY")
            conn.close()
            time.sleep(0.5)  # the port stays taken a while after kill-server returned
            sys.exit(0)
        conn.sendall(b"OKAY0000")  # an empty device list for anything else
        conn.close()

if "kill-server" in args:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"0009host:kill")
        conn.recv(4)
    sys.exit(0)

print(f"fake adb: {args} is not faked", file=sys.stderr)
sys.exit(1)
