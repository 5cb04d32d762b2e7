"""A lab with tokens, as an admin sets one up: the first token straight on the database,
the rest through the coordinator; exporters and people each with their own."""
import json
import socket
import stat
import subprocess
import sys
import threading

import pytest

from conftest import Coordinator, Exporter, sim_devices, wait_for
from device_loop.client import Lab
from helpers import run_cli, uart_exchange, wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


def test_a_lab_with_tokens(tmp_path, env):
    coordinator = Coordinator(tmp_path, env, extra=())
    data_dir = str(tmp_path / "coord")
    url = coordinator.url
    try:
        first = run_cli(env, url, "admin", "token", "create", "root", "--admin", "--data-dir", data_dir, "--json")
        root = {**env, "DEVICE_LOOP_TOKEN": json.loads(first.stdout)["token"]}

        anonymous = run_cli(env, url, "reserve", "sim-board-0", "--json", check=False)
        assert anonymous.returncode == 1 and json.loads(anonymous.stdout)["error"] == "unauthenticated"

        made = json.loads(run_cli(root, url, "admin", "token", "create", "--exporter", "host-a", "--json").stdout)
        token_file = tmp_path / "exporter.token"
        token_file.write_text(made["token"])
        token_file.chmod(0o600)
        exporter = Exporter(tmp_path, env, url, sim_devices("sim-board-0"), token_file=str(token_file))
        try:
            wait_state(coordinator, "sim-board-0", "idle")

            created = run_cli(root, url, "admin", "token", "create", "alice", "--json")
            assert "note:" not in created.stderr, "ALICE is the token's user, not the --user option"
            alice_token = json.loads(created.stdout)
            token_path = tmp_path / "home" / ".config" / "device-loop" / "token"
            token_path.parent.mkdir(parents=True)
            token_path.write_text(alice_token["token"] + "\n")
            token_path.chmod(0o644)
            unsafe = run_cli(env, url, "ls", "--json", check=False)
            assert unsafe.returncode == 1 and "chmod 600" in json.loads(unsafe.stdout)["message"]
            token_path.chmod(stat.S_IRUSR | stat.S_IWUSR)

            bob = {**env, "DEVICE_LOOP_USER": "bob"}  # the name means nothing: the token says alice
            lease = json.loads(run_cli(bob, url, "reserve", "sim-board-0", "--wait", "--json").stdout)
            assert lease["holder"] == "alice" and all(e["secret"] for e in lease["endpoints"])
            uart_exchange("127.0.0.1", lease["endpoints"][0]["port"], b"uname\r\n", b"DENIED")  # the gate
            said = subprocess.run([sys.executable, "-m", "device_loop.cli", "--coordinator", url, "console",
                                   lease["id"], "--timeout", "1"], input=b"uname\r", env=env,
                                  capture_output=True, timeout=30)
            assert b"Linux sim-board-0" in said.stdout, said.stderr
            with Lab(url, token=alice_token["token"]).lease(lease["id"]).connect("uart") as conn:
                conn.settimeout(5)  # the Python client spoke the gate's handshake: this is the console now
                conn.sendall(b"hostname\r")
                said = b""
                while b"sim-board-0\r\n" not in said:
                    chunk = conn.recv(4096)
                    assert chunk, f"the console closed after {said!r}"
                    said += chunk

            mine = run_cli(env, url, "status", "--user", "carol")  # --user counts only without tokens: said so
            assert lease["id"] in mine.stdout and "this one knows you by your token" in mine.stderr
            run_cli(root, url, "admin", "drain", "host-a")
            audit = run_cli(root, url, "admin", "audit").stdout
            assert "drain" in audit and "host=host-a" in audit
            run_cli(root, url, "admin", "drain", "host-a", "--undo")

            listed = run_cli(root, url, "admin", "token", "ls").stdout
            assert "exporter host-a" in listed and "alice" in listed and alice_token["token"] not in listed
            run_cli(root, url, "admin", "token", "revoke", alice_token["id"])
            twice = run_cli(root, url, "admin", "token", "revoke", alice_token["id"], "--json", check=False)
            assert twice.returncode == 1 and "revoked already" in json.loads(twice.stdout)["message"]
            revoked = run_cli(env, url, "status", lease["id"], "--json", check=False)
            assert revoked.returncode == 1 and json.loads(revoked.stdout)["error"] == "bad_token"
        finally:
            exporter.stop()
    finally:
        coordinator.stop()


class CountingProxy:
    """A TCP proxy to a local port that counts how often ``marker`` passed towards it."""

    def __init__(self, port: int, marker: bytes):
        self.target, self.marker, self.count = port, marker, 0
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client = self.server.accept()[0]
            except OSError:  # closed
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        tail = b""  # (a marker may come in two pieces)
        try:
            while data := source.recv(65536):
                if counted:
                    with self.lock:
                        self.count += (tail + data).count(self.marker)
                    tail = (tail + data)[-(len(self.marker) - 1):]
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self.server.close()


def test_an_exporter_without_its_token_is_refused(tmp_path, env):
    coordinator = Coordinator(tmp_path, env, extra=())
    heartbeats = CountingProxy(coordinator.port, b"POST /api/v1/hosts/host-a/heartbeat ")
    exporter = Exporter(tmp_path, env, heartbeats.url, sim_devices("sim-board-0"), heartbeat_s=0.2)
    try:
        wait_for(lambda: "heartbeat refused (401)" in exporter.output(), what="the refusal in the log")
        refused = heartbeats.count
        # one heartbeat goes only once the answer to the one before came: 3 more refusals taken
        wait_for(lambda: heartbeats.count >= refused + 4, what="more heartbeats")
        assert coordinator.api("/devices").json() == []
        assert exporter.output().count("heartbeat refused") == 1 and "Traceback" not in exporter.output()
    finally:
        exporter.stop()
        coordinator.stop()
        heartbeats.close()
