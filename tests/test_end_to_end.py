"""Coordinator and exporter as real processes: reserve, talk to a board, release, crash, restart."""
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import Coordinator, Exporter, sim_devices, uart_device, wait_for
from device_loop.core.ports import free_port
from helpers import (device, pid_alive, port_open, raw_endpoint, recorded_pids, reserve, run_cli, uart_exchange,
                     wait_active, wait_state)

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]


def test_reserve_talk_release(coordinator, exporter_factory):
    exporter = exporter_factory()
    wait_state(coordinator, "sim-board-0", "idle")

    lease = reserve(coordinator, "sim-board-0")
    assert lease["id"].startswith("lease-")
    assert lease["state"] == "pending" and lease["endpoints"] == []
    assert lease["reason"] == "waiting for exporter host-a to start the services"

    lease = wait_active(coordinator, lease["id"])
    assert lease["device_state"] == "in_use"
    (endpoint,) = lease["endpoints"]
    assert endpoint["kind"] == "uart"
    said = uart_exchange(endpoint["host"], endpoint["port"], b"uname\r", b"sim-board-0:~# ")
    assert b"Linux sim-board-0" in said
    said = uart_exchange(endpoint["host"], endpoint["port"], b"reboot\r", b"simulated board sim-board-0")
    assert device(coordinator, "sim-board-0")["holder"] == "alice"
    assert recorded_pids(exporter.state_dir) == {}, "a sim board's console is a thread of the exporter"

    released = coordinator.api(f"/leases/{lease['id']}/release", "POST").json()
    assert released["state"] == "released" and released["endpoints"] == []
    wait_state(coordinator, "sim-board-0", "idle")
    assert not port_open(endpoint["host"], endpoint["port"])
    log = coordinator.api("/devices/sim-board-0/log").json()
    assert [(e["from"], e["to"]) for e in log][-4:] == [
        ("idle", "allocating"), ("allocating", "in_use"), ("in_use", "reclaiming"), ("reclaiming", "idle")]


def test_a_service_process_ends_with_its_lease(coordinator, exporter_factory, pty_pair, echo_board):
    exporter = exporter_factory(uart_device(pty_pair, raw=True))
    wait_state(coordinator, "jupiter", "idle")
    lease = wait_active(coordinator, reserve(coordinator, "jupiter")["id"])
    endpoint = raw_endpoint(lease)
    uart_exchange(endpoint["host"], endpoint["port"], b"ping", b"ping")
    (pid, record), = recorded_pids(exporter.state_dir).items()
    assert record["lease"] == lease["id"] and "ser2net" in record["name"]

    coordinator.api(f"/leases/{lease['id']}/release", "POST")
    wait_state(coordinator, "jupiter", "idle")
    assert not pid_alive(pid) and not port_open(endpoint["host"], endpoint["port"])
    assert recorded_pids(exporter.state_dir) == {}


def test_exporter_killed_and_restarted_converges(coordinator, exporter_factory, pty_pair, echo_board):
    exporter = exporter_factory(uart_device(pty_pair, raw=True))
    wait_state(coordinator, "jupiter", "idle")
    lease = wait_active(coordinator, reserve(coordinator, "jupiter")["id"])
    (old_pid,) = recorded_pids(exporter.state_dir)

    exporter.stop(signal.SIGKILL)
    assert pid_alive(old_pid), "ser2net outlives a kill -9 of its exporter: that is the orphan to clean"
    exporter.start()

    def republished():
        current = coordinator.api(f"/leases/{lease['id']}").json()
        pids = recorded_pids(exporter.state_dir)
        if current["ready"] and pids and old_pid not in pids:
            return current
    current = wait_for(republished, what="service back with a new process")
    assert current["state"] == "active" and current["id"] == lease["id"]
    assert not pid_alive(old_pid), "the old ser2net was left running"
    endpoint = raw_endpoint(current)
    uart_exchange(endpoint["host"], endpoint["port"], b"ping", b"ping")


def test_leases_of_a_killed_exporter_are_not_ready_at_once(coordinator, exporter_factory):
    exporter = exporter_factory(heartbeat_s=30.0)  # silence alone would take 90 s to notice
    wait_state(coordinator, "sim-board-0", "idle")
    lease = wait_active(coordinator, reserve(coordinator, "sim-board-0")["id"])

    exporter.stop(signal.SIGKILL)
    gone = wait_for(lambda: (lambda s: s if not s["ready"] else None)(coordinator.api(f"/leases/{lease['id']}").json()),
                    what="the lease no longer ready")
    assert gone["endpoints"] == [] and "lost its connection" in gone["reason"], gone
    assert gone["device_state"] == "in_use" and coordinator.api("/hosts").json()[0]["online"], \
        "its long-poll was cut: that is not silence (the host is taken for offline only after 3 periods)"

    exporter.start()
    back = wait_active(coordinator, lease["id"])
    (endpoint,) = back["endpoints"]
    uart_exchange(endpoint["host"], endpoint["port"], b"uname\r", b"Linux sim-board-0")


def test_a_service_that_dies_is_restarted(coordinator, exporter_factory, pty_pair, echo_board):
    exporter = exporter_factory(uart_device(pty_pair, raw=True))
    wait_state(coordinator, "jupiter", "idle")
    lease = wait_active(coordinator, reserve(coordinator, "jupiter")["id"])
    (old_pid,) = recorded_pids(exporter.state_dir)
    os.kill(old_pid, signal.SIGKILL)

    def restarted():
        pids = recorded_pids(exporter.state_dir)
        current = coordinator.api(f"/leases/{lease['id']}").json()
        fresh = current["endpoints"] and current["endpoints"] != lease["endpoints"]
        return current if pids and old_pid not in pids and fresh else None
    current = wait_for(restarted, what="a new ser2net")
    endpoint = raw_endpoint(current)
    uart_exchange(endpoint["host"], endpoint["port"], b"ping", b"ping")
    assert "died; restarting it" in exporter.output()


def test_an_exporter_that_stops_says_so(coordinator, exporter_factory):
    exporter = exporter_factory(heartbeat_s=30.0)  # silence alone would take 90 s to notice
    wait_state(coordinator, "sim-board-0", "idle")
    lease = wait_active(coordinator, reserve(coordinator, "sim-board-0")["id"])
    exporter.stop()
    gone = coordinator.api(f"/leases/{lease['id']}").json()
    assert gone["device_state"] == "offline" and gone["endpoints"] == [] and not gone["ready"]
    assert coordinator.api("/hosts").json()[0]["online"] is False
    assert coordinator.api("/devices/sim-board-0/log").json()[-1]["cause"] == "exporter host-a stopped"


def test_coordinator_killed_and_restarted_keeps_leases(coordinator, exporter_factory):
    exporter_factory()
    wait_state(coordinator, "sim-board-0", "idle")
    lease = wait_active(coordinator, reserve(coordinator, "sim-board-0")["id"])

    coordinator.stop(signal.SIGKILL)  # an acknowledged lease survives a crash, not only a clean stop
    coordinator.start()
    coordinator.wait_ready()

    after = coordinator.api(f"/leases/{lease['id']}").json()
    assert after["state"] == "active"
    assert after["expires_at"] == lease["expires_at"]
    assert after["endpoints"] == lease["endpoints"]
    busy = coordinator.api("/leases", "POST", json={"device": "sim-board-0"}, headers={"X-Device-Loop-User": "bob"})
    assert busy.status_code == 409 and "held by alice" in busy.json()["message"]
    (endpoint,) = after["endpoints"]
    uart_exchange(endpoint["host"], endpoint["port"], b"uname\r", b"Linux sim-board-0")


def test_allocation_timeout_fails_lease_cleanly(tmp_path, env):
    coordinator = Coordinator(tmp_path, env, extra=["--single-user", "--allocating-timeout", "2s"])
    exporter = Exporter(tmp_path, env, coordinator.url, sim_devices("sim-board-0"))
    try:
        wait_state(coordinator, "sim-board-0", "idle")
        exporter.popen.send_signal(signal.SIGSTOP)  # a hung exporter: it never starts the service
        waited = run_cli(env, coordinator.url, "reserve", "sim-board-0", "--wait", "--timeout", "1s", "--json",
                         check=False)
        answer = json.loads(waited.stdout)
        assert waited.returncode == 1 and answer["error"] == "timeout"
        lease = {"id": answer["lease"]}  # the lease left behind is named as a field, not only in the message
        failed = wait_for(lambda: (l := coordinator.api(f"/leases/{lease['id']}").json())["state"] == "failed" and l,
                          what="lease failed")
        assert "did not come up within 2s" in failed["end_reason"]
        assert device(coordinator, "sim-board-0")["state"] == "reclaiming"
        exporter.popen.send_signal(signal.SIGCONT)
        wait_state(coordinator, "sim-board-0", "idle")
    finally:
        exporter.popen.send_signal(signal.SIGCONT)
        exporter.stop()
        coordinator.stop()


def test_cli_round_trip(coordinator, exporter_factory, env):
    exporter_factory()
    wait_state(coordinator, "sim-board-0", "idle")
    url = coordinator.url

    pending = json.loads(run_cli(env, url, "reserve", "sim-board-1", "--ttl", "90s", "--json").stdout)
    assert pending["state"] == "pending" and pending["endpoints"] == []

    lease = json.loads(run_cli(env, url, "reserve", "sim-board-0", "--ttl", "30m", "--wait", "--json").stdout)
    assert lease["state"] == "active" and lease["endpoints"][0]["kind"] == "uart"
    uart_exchange("127.0.0.1", lease["endpoints"][0]["port"], b"help\r", b"commands:")

    devices = json.loads(run_cli(env, url, "ls", "--json").stdout)
    row = next(d for d in devices if d["name"] == "sim-board-0")
    assert {"name", "class", "tags", "state", "host", "holder", "expires_at", "resources"} <= row.keys()
    assert row["holder"] == "alice" and row["resources"][0] == {**row["resources"][0], "kind": "uart", "plugin": "sim"}
    table = run_cli(env, url, "ls").stdout
    assert "sim-board-0" in table and "in_use" in table and "alice" in table

    renewed = json.loads(run_cli(env, url, "renew", lease["id"], "--ttl", "2h", "--json").stdout)
    assert renewed["expires_at"] > lease["expires_at"]
    status = json.loads(run_cli(env, url, "status", "sim-board-0", "--json").stdout)
    assert status["id"] == lease["id"]

    refused = run_cli({**env, "DEVICE_LOOP_USER": "bob"}, url, "reserve", "sim-board-0", "--json", check=False)
    assert refused.returncode == 1 and json.loads(refused.stdout)["error"] == "busy"
    mine = run_cli(env, url, "reserve", "sim-board-0", "--json", check=False)
    assert mine.returncode == 1 and json.loads(mine.stdout)["error"] == "already_yours"
    assert lease["id"] in json.loads(mine.stdout)["message"]
    usage = run_cli(env, url, "reserve", "sim-board-0", "--ttl", "soon", "--json", check=False)
    assert usage.returncode == 2 and json.loads(usage.stdout)["error"] == "usage"
    unknown = run_cli(env, url, "status", "lease-0000", "--json", check=False)
    assert unknown.returncode == 1 and json.loads(unknown.stdout)["error"] == "unknown_lease"

    assert run_cli(env, url, "reserve", "sim-board-1", "--timeout", "5s", check=False).returncode == 2  # needs --wait
    assert run_cli(env, "127.0.0.1:7521", "ls", check=False).returncode == 2  # not a URL
    nosuch = run_cli(env, url, "release", "nosuch", "--json", check=False)
    assert nosuch.returncode == 1 and json.loads(nosuch.stdout)["error"] == "unknown_device"

    released = json.loads(run_cli(env, url, "release", lease["id"], "--json").stdout)
    assert released["state"] == "released"
    ended = json.loads(run_cli(env, url, "status", "sim-board-0", "--json").stdout)  # the last lease, ended
    assert ended["id"] == lease["id"] and ended["state"] == "released"
    again = run_cli(env, url, "release", "sim-board-0", "--json", check=False)
    assert again.returncode == 1 and "is released" in json.loads(again.stdout)["message"]
    wait_state(coordinator, "sim-board-0", "idle")
    log = json.loads(run_cli(env, url, "log", "sim-board-0", "--json").stdout)
    assert log[-1]["to"] == "idle" and all({"at", "cause", "actor"} <= e.keys() for e in log)
    hosts = json.loads(run_cli(env, url, "hosts", "--json").stdout)
    assert hosts[0]["name"] == "host-a" and "sim" in hosts[0]["plugins"]["loaded"]
    assert set(hosts[0]["plugins"]["loaded"]) >= {"sim", "uart", "video", "vnc", "flash"}


def test_a_database_it_cannot_open_is_one_line_not_a_traceback(env):
    done = subprocess.run([sys.executable, "-m", "device_loop.cli", "coordinator", "--port", "0",
                           "--database-url", f"postgresql://lab:secret@127.0.0.1:{free_port()}/lab"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "cannot open the database postgresql://127.0.0.1:" in done.stderr and "secret" not in done.stderr
