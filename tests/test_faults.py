"""Crashes of real processes at bad moments: the coordinator killed (kill -9) in the middle
of a burst of reserves, on SQLite and on PostgreSQL; an exporter killed while it serves
leases with several kinds of service processes, and while a start is still in flight."""
import asyncio
import contextlib
import os
import signal
import socket
import threading
import time

import cv2
import httpx2
import numpy as np
import pytest

from conftest import Coordinator, Exporter, sim_devices, uart_device, wait_for
from helpers import (kill_spawned, pid_alive, raw_endpoint, recorded_pids, reserve, spawned_by, uart_exchange,
                     wait_active, wait_state, write_clip)
from live_lab import LIVE
from test_video import camera_of, frames, with_camera
from test_vnc import banner, screen_of

pytestmark = [pytest.mark.service, pytest.mark.timeout(150)]

HEARTBEAT_S = 2.0


def as_user(user: str) -> dict:
    return {"headers": {"X-Device-Loop-User": user}}


# ---- the coordinator killed in the middle of a burst of reserves -----------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def coordinator_args(request) -> tuple[str, ...]:
    """The arguments of a coordinator on SQLite (in its data folder), or on a PostgreSQL database."""
    if request.param == "sqlite":
        return ("--single-user",)
    return ("--single-user", "--database-url", request.getfixturevalue("postgres_database"))


class AnswerGate:
    """A TCP proxy to a local port that passes the requests of every connection and the
    answers of its first ``passed`` connections only: a later connection's answer is held
    and, when its connection ends, dropped. However late its client reads, whatever it does
    after the last answer passed, it does with the other requests unanswered."""

    def __init__(self, port: int, passed: int):
        self.target, self.passed, self.answering = port, passed, 0
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # (closed)
            while True:
                client = self.server.accept()[0]
                try:
                    upstream = socket.create_connection(("127.0.0.1", self.target))
                except OSError:  # the coordinator is gone: no answer
                    client.close()
                    continue
                threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
                threading.Thread(target=self._answers, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _requests(client: socket.socket, upstream: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                upstream.sendall(data)
            upstream.shutdown(socket.SHUT_WR)

    def _answers(self, upstream: socket.socket, client: socket.socket) -> None:
        held = None
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                if held is None:
                    with self.lock:
                        held, self.answering = self.answering >= self.passed, self.answering + 1
                if not held:
                    client.sendall(data)
        for end in (client, upstream):  # (a held answer is never sent: to its client, the request got no answer)
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)  # (wakes the other direction's recv: a close alone would not)
            end.close()

    def close(self) -> None:
        self.server.close()


async def reserve_burst(coordinator: Coordinator, names: list[str], kill_after: int) -> tuple[dict, list[str]]:
    """Every device of ``names`` reserved at once, each by a user of its own with an
    Idempotency-Key, through an ``AnswerGate`` that passes ``kill_after`` answers; the
    coordinator is killed (SIGKILL) as the ``kill_after``-th 201 comes back, the other
    requests made, under way or not yet read by it. (device -> the lease answered 201, the
    devices whose reserve got no answer)."""
    acked, unanswered = {}, []
    gate = AnswerGate(coordinator.port, kill_after)
    async with httpx2.AsyncClient(base_url=f"{gate.url}/api/v1", timeout=30,
                                  limits=httpx2.Limits(max_keepalive_connections=0)) as client:
        async def one(name: str) -> None:
            try:
                response = await client.post("/leases", json={"device": name, "ttl_s": 3600},
                                             headers={"X-Device-Loop-User": f"u-{name}", "Idempotency-Key": f"k-{name}"})
            except httpx2.HTTPError:
                unanswered.append(name)
                return
            assert response.status_code == 201, response.text
            acked[name] = response.json()
            if len(acked) == kill_after:
                coordinator.popen.send_signal(signal.SIGKILL)
        try:
            await asyncio.gather(*(one(name) for name in names))
        finally:
            gate.close()
    coordinator.popen.wait(10)
    return acked, unanswered


def lab_state(coordinator: Coordinator) -> dict[str, str]:
    """Each device as a word: ``idle``, ``ready`` (its live lease has its endpoints), or what it is."""
    out = {}
    for d in coordinator.api("/devices").json():
        if d["holder"] is None:
            out[d["name"]] = d["state"]
            continue
        (lease,) = coordinator.api("/leases", params={"device": d["name"]}, **as_user(d["holder"])).json()
        out[d["name"]] = "ready" if lease["ready"] and lease["endpoints"] else f"{lease['state']}: {lease['reason']}"
    return out


def wait_converged(coordinator: Coordinator, within: float) -> dict[str, str]:
    """Wait until every leased device is ready and every other one idle, ``within`` seconds at most."""
    deadline = time.monotonic() + within
    while True:
        state = lab_state(coordinator)
        if all(s in ("idle", "ready") for s in state.values()):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"not converged within {within:.1f}s: "
                                 f"{ {n: s for n, s in state.items() if s not in ('idle', 'ready')} }")
        time.sleep(0.05)


@pytest.mark.anyio
async def test_acknowledged_leases_survive_a_kill_9_in_a_burst(tmp_path, env, coordinator_args):
    """Every reserve answered 201 before the coordinator was killed is there after its
    restart (same id, holder, expiry, still live); a reserve that got no answer, retried
    with its Idempotency-Key, gets the lease it made if it made one (never a second); the
    exporter converges within two heartbeat periods of the restart."""
    names = [f"sim-board-{i}" for i in range(32)]
    coordinator = Coordinator(tmp_path, env, extra=coordinator_args)
    exporter = Exporter(tmp_path, env, coordinator.url, sim_devices(*names), heartbeat_s=HEARTBEAT_S)
    try:
        wait_for(lambda: lab_state(coordinator) == dict.fromkeys(names, "idle"), what="32 idle boards")
        # killed at the 3rd answer; the other answers are held (however late this client reads,
        # the kill lands with requests unanswered: some made, some not)
        acked, unanswered = await reserve_burst(coordinator, names[:28], kill_after=3)
        assert len(acked) == 3 and len(unanswered) == 25, f"the kill did not land mid-burst: {len(acked)} answered"

        coordinator.start()
        coordinator.wait_ready()
        restarted = time.monotonic()
        for name, lease in acked.items():
            now = coordinator.api(f"/leases/{lease['id']}", **as_user(lease["holder"])).json()
            assert (now.get("id"), now.get("holder"), now.get("device"), now.get("expires_at")) == \
                   (lease["id"], lease["holder"], name, lease["expires_at"]) and now["state"] in LIVE, str(now)
        wait_converged(coordinator, 2 * HEARTBEAT_S - (time.monotonic() - restarted))

        held = {d["name"]: d["holder"] for d in coordinator.api("/devices").json()}
        for name in unanswered:
            made = coordinator.api("/leases", params={"device": name}, **as_user(f"u-{name}")).json()
            retried = coordinator.api("/leases", "POST", json={"device": name, "ttl_s": 3600},
                                      headers={"X-Device-Loop-User": f"u-{name}", "Idempotency-Key": f"k-{name}"})
            assert retried.status_code == 201, retried.text
            if held[name] is not None:  # it was made before the kill: the same lease comes back
                assert held[name] == f"u-{name}" and retried.json()["id"] == made[0]["id"], (made, retried.json())
        state = wait_converged(coordinator, 20)
        assert {n for n, s in state.items() if s == "ready"} == set(names[:28]), state
        for name in names[:28]:
            (lease,) = coordinator.api("/leases", params={"device": name}, **as_user(f"u-{name}")).json()
            (endpoint,) = lease["endpoints"]
            uart_exchange(endpoint["host"], endpoint["port"], b"\r", f"{name}:~# ".encode())
    finally:
        exporter.stop()
        coordinator.stop()


# ---- an exporter killed with several services, and while a start is in flight ------------------


def new_boot(coordinator: Coordinator, old: str) -> bool:
    """Whether host-a reports from a boot other than ``old`` (its exporter started again)."""
    return coordinator.api("/hosts").json()[0]["boot_id"] != old


def ready_again(coordinator: Coordinator, leases: list[dict], old_boot: str) -> list[dict] | None:
    """The leases, once each is ready with endpoints its exporter's new boot reported."""
    if not new_boot(coordinator, old_boot):
        return None
    now = [coordinator.api(f"/leases/{lease['id']}").json() for lease in leases]
    return now if all(n["ready"] and n["endpoints"] for n in now) else None


def snapshot_is_a_frame(url: str) -> bool:
    jpeg = httpx2.get(url + "snapshot.jpg", timeout=10)
    return jpeg.status_code == 200 and cv2.imdecode(np.frombuffer(jpeg.content, np.uint8), cv2.IMREAD_COLOR) is not None


def test_exporter_killed_with_several_kinds_of_service_leaves_none_behind(tmp_path, env, coordinator, pty_pair,
                                                                          echo_board, display):
    """Four leases at once (ser2net on a UART, a camera's stream process, x11vnc with
    websockify on an X display, a simulated board's thread) when the exporter is killed:
    the restarted exporter ends every process the dead one started, serves each lease
    again, and every endpoint answers; once released, nothing of either run is left."""
    devices = [*uart_device(pty_pair, raw=True), with_camera("cam-0"),
               {"name": "screen-0", "class": "x-display", "plugin": "vnc", "display": f":{display}"},
               *sim_devices("sim-board-0")]
    exporter = Exporter(tmp_path, env, coordinator.url, devices)
    try:
        for name in ("jupiter", "cam-0", "screen-0", "sim-board-0"):
            wait_state(coordinator, name, "idle")
        leases = [wait_active(coordinator, reserve(coordinator, name)["id"])
                  for name in ("jupiter", "cam-0", "screen-0", "sim-board-0")]
        before = recorded_pids(exporter.state_dir)
        kinds = sorted(record["name"].split("-")[0] for record in before.values())
        assert kinds == ["ser2net", "video", "websockify", "x11vnc"], kinds
        assert spawned_by(exporter.state_dir) == before.keys(), "every service process is recorded"
        old_boot = coordinator.api("/hosts").json()[0]["boot_id"]

        exporter.stop(signal.SIGKILL)
        assert all(pid_alive(pid) for pid in before), "services outlive a kill -9 of their exporter: the orphans"
        exporter.start()
        current = wait_for(lambda: ready_again(coordinator, leases, old_boot), what="every lease served again")

        left = [before[pid]["name"] for pid in before if pid_alive(pid)]
        assert not left, f"processes of the killed exporter still run: {left}"
        after = recorded_pids(exporter.state_dir)
        assert spawned_by(exporter.state_dir) == after.keys() and not after.keys() & before.keys()
        uart, cam, screen, board = current
        endpoint = raw_endpoint(uart)
        uart_exchange(endpoint["host"], endpoint["port"], b"ping", b"ping")
        assert snapshot_is_a_frame(camera_of(cam)["url"])
        rfb, _ = screen_of(screen)
        with socket.create_connection((rfb["host"], rfb["port"]), timeout=10) as sock:
            assert banner(sock).startswith(b"RFB 003.00")
        (endpoint,) = board["endpoints"]
        uart_exchange(endpoint["host"], endpoint["port"], b"\r", b"sim-board-0:~# ")

        for lease in current:
            coordinator.api(f"/leases/{lease['id']}/release", "POST")
        for lease in current:
            wait_state(coordinator, lease["device"], "idle")
        assert spawned_by(exporter.state_dir) == set(), "a service process outlived its lease"
    finally:
        exporter.stop()
        kill_spawned(exporter.state_dir)


def test_exporter_killed_while_a_start_is_in_flight(tmp_path, env, coordinator):
    """A camera whose source (a FIFO nobody writes) holds its stream process in open(): the
    exporter is killed while that start is in flight, the lease still pending. The source
    is fixed (the FIFO replaced by a clip); the restarted exporter ends the stuck process
    and brings the lease up; a board served before the kill is served again."""
    source = tmp_path / "screen.avi"
    os.mkfifo(source)
    exporter = Exporter(tmp_path, env, coordinator.url,
                        [with_camera("cam-f", source=None, file=str(source)), *sim_devices("sim-board-0")])
    try:
        wait_state(coordinator, "cam-f", "idle")
        wait_state(coordinator, "sim-board-0", "idle")
        board = wait_active(coordinator, reserve(coordinator, "sim-board-0")["id"])
        lease = reserve(coordinator, "cam-f")

        def started():
            return [pid for pid, record in recorded_pids(exporter.state_dir).items() if record["lease"] == lease["id"]]
        (stuck,) = wait_for(started, interval=0.01, what="the camera's stream process started")
        old_boot = coordinator.api("/hosts").json()[0]["boot_id"]
        exporter.stop(signal.SIGKILL)
        assert pid_alive(stuck) and coordinator.api(f"/leases/{lease['id']}").json()["state"] == "pending", \
            "the start was still in flight when its exporter died"

        os.replace(write_clip(tmp_path / "clip.avi"), source)
        exporter.start()
        cam, board = wait_for(lambda: ready_again(coordinator, [lease, board], old_boot),
                              what="the camera and the board served by the new exporter")
        assert not pid_alive(stuck), "the stream process stuck in its start was left running"
        assert spawned_by(exporter.state_dir) == recorded_pids(exporter.state_dir).keys()
        assert len(frames(camera_of(cam)["url"] + "stream.mjpg", 3)) == 3
        (endpoint,) = board["endpoints"]
        uart_exchange(endpoint["host"], endpoint["port"], b"\r", b"sim-board-0:~# ")
    finally:
        exporter.stop()
        kill_spawned(exporter.state_dir)
