"""Keepalive leases from the client's side, against a real lab (docs/architecture.md, "Leases that
live as long as their client"): the ``with`` block keeps its lease alive past its keepalive, a
ticket followed with ``wait()`` does not lapse, a lease the lab ends is told once, and
``device-loop reserve --keepalive`` holds its lease while it runs: released at the end of its
input or on SIGTERM, lost as a lab failure (exit 75), and freed within the keepalive when it is
killed outright."""
import json
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import Coordinator, Exporter, sim_devices, wait_for
from device_loop.client.http import CoordinatorError
from device_loop.client.lab import Lab
from device_loop.core.durations import parse_iso
from device_loop.core.vocabulary import LAB_FAILURE_STATUS
from test_exec_console import environment

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

KEEPALIVE_S = 5  # the shortest there is: the tests wait it out
SENTINEL = "erin"  # who queues the tickets nobody follows (reaped_past_a_lapse)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """(its URL, the coordinator, the environment): two simulated boards, both idle; the
    coordinator's reaper passes every second, as a lab's does."""
    tmp_path = tmp_path_factory.mktemp("keepalive-lab")
    env = environment(tmp_path)
    coordinator = Coordinator(tmp_path, env)
    exporter = Exporter(tmp_path, env, coordinator.url, sim_devices("sim-board-0", "sim-board-1"))
    try:
        yield coordinator.url, coordinator, env
    finally:
        exporter.stop()
        coordinator.stop()


def idle(coordinator: Coordinator, *names: str) -> None:
    """Wait until ``names`` are idle (reported, the last lease's reclaim done)."""
    wait_for(lambda: all(coordinator.api(f"/devices/{n}").json().get("state") == "idle" for n in names),
             what=f"{', '.join(names)} idle")


def lease_of(coordinator: Coordinator, lease_id: str, user: str = "alice") -> dict:
    return coordinator.api(f"/leases/{lease_id}", headers={"X-Device-Loop-User": user}).json()


def past(moment: str, seconds: float) -> bool:
    return time.time() > parse_iso(moment) + seconds


def reaped_past_a_lapse(url: str, coordinator: Coordinator, held: str) -> None:
    """Return once whatever lapses within ``KEEPALIVE_S`` from now has lapsed and the reaper has
    passed after it (in place of a wait for the keepalive and a margin for the reaper's period):
    a keepalive ticket nobody follows, queued now for ``held`` (a device someone holds), lapses
    ``KEEPALIVE_S`` from now, and the reaper's pass that expires it ends, in the same
    transaction and at the same moment, every lease that lapsed before it."""
    ticket = Lab(url, user=SENTINEL).reserve(held, queue=True, keepalive=KEEPALIVE_S)
    assert ticket.state == "waiting", ticket

    def expired() -> bool:  # (listing its tickets is no read of one: it keeps nothing alive)
        tickets = coordinator.api("/tickets", headers={"X-Device-Loop-User": SENTINEL}).json()
        return [t["state"] for t in tickets if t["ticket"] == ticket.id] == ["expired"]
    wait_for(expired, what=f"the reaper to expire {ticket.id}, a ticket nobody follows, {KEEPALIVE_S}s on")


def test_a_with_block_keeps_its_lease_alive_and_a_followed_ticket_waits_alive(lab):
    url, coordinator, _ = lab
    idle(coordinator, "sim-board-0")
    alice, bob = Lab(url, user="alice"), Lab(url, user="bob")
    got: dict = {}
    with alice.reserve("sim-board-0", keepalive=KEEPALIVE_S) as lease:
        assert lease.data["keepalive_s"] == KEEPALIVE_S and lease.data["ready"]
        first_lapse = lease.data["expires_at"]
        ticket = bob.reserve("sim-board-0", queue=True, keepalive=f"{KEEPALIVE_S}s")
        follower = threading.Thread(target=lambda: got.update(lease=ticket.wait(timeout=60)))
        follower.start()
        # past the first lapse and a reaper pass: kept alive, both of them
        reaped_past_a_lapse(url, coordinator, "sim-board-0")
        assert past(first_lapse, 0), "(the sentinel lapsed after the lease's first lapse)"
        assert lease_of(coordinator, lease.id)["state"] == "active", "the with block keeps it alive"
        tickets = coordinator.api("/tickets", headers={"X-Device-Loop-User": "bob"}).json()
        assert [t["state"] for t in tickets if t["ticket"] == ticket.id] == ["waiting"], "wait() keeps it"
        keeper = lease.keeper
    assert keeper is not None and not keeper._thread.is_alive(), "leaving the block stops keeping it alive"
    assert lease.state == "released" and lease.lost is None
    follower.join(30)
    granted = got["lease"]
    assert (granted.device, granted.data["keepalive_s"]) == ("sim-board-0", KEEPALIVE_S), "its grant keeps alive too"
    with granted:
        assert granted.keeper is not None
    assert lease_of(coordinator, granted.id, "bob")["state"] == "released"


def test_a_lease_the_lab_ends_is_lost_and_told_once(lab):
    url, coordinator, _ = lab
    idle(coordinator, "sim-board-1")
    lease = Lab(url, user="alice").reserve("sim-board-1", keepalive=KEEPALIVE_S)
    told: list[str] = []
    keeper = lease.kept_alive(on_lost=told.append)
    assert lease.kept_alive() is keeper, "one thread a lease"
    assert coordinator.api(f"/admin/leases/{lease.id}/revoke", "POST").status_code == 200
    wait_for(lambda: not keeper._thread.is_alive(), timeout=KEEPALIVE_S, what="the keep-alive thread to end")
    assert len(told) == 1 and "revoked" in told[0] and lease.lost == told[0], told
    lease.release()  # (of a lease already ended: said as it is, no error)


def test_what_the_lab_refuses_it_says_before_anything_is_reserved(lab):
    url, coordinator, _ = lab
    client = Lab(url, user="dave")
    for kwargs, code in (({"keepalive": 0}, "invalid"), ({"keepalive": 10 * 365 * 86400}, "invalid"),
                         ({"keepalive": float("nan")}, "invalid"), ({"image": "no-such-build"}, "unknown_image")):
        with pytest.raises(CoordinatorError) as refused:
            client.reserve(class_="sim-board", **kwargs)
        assert (refused.value.code, refused.value.status) == (code, 404 if code == "unknown_image" else 422), kwargs
    assert client.my_leases() == []
    cli = subprocess.run([sys.executable, "-m", "device_loop.cli", "--coordinator", url, "--user", "dave", "reserve",
                          "--class", "sim-board", "--image", "no-such-build", "--json"], env=lab[2],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1 and json.loads(cli.stdout)["error"] == "unknown_image", cli.stdout + cli.stderr


def _hold(url: str, env: dict, device: str, *args: str, command: tuple[str, ...] = ("reserve",),
          user: str = "alice") -> subprocess.Popen:
    """``device-loop reserve DEVICE --keepalive 5s --json ARGS``, its lease printed once ready."""
    process = subprocess.Popen([sys.executable, "-m", "device_loop.cli", "--coordinator", url, "--user", user,
                                *command, device, *args, "--json"], env=env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    return process


def test_a_queued_keepalive_reserve_and_ticket_wait_hold_their_grant(lab):
    """``reserve --queue --keepalive`` and ``ticket --wait`` of a keepalive ticket follow it past
    its lapse (each read keeps it) and hold its lease as ``reserve --keepalive`` does."""
    url, coordinator, env = lab
    idle(coordinator, "sim-board-0", "sim-board-1")
    alice, carol = Lab(url, user="alice"), Lab(url, user="carol")
    with alice.reserve("sim-board-0", keepalive=KEEPALIVE_S) as first, \
            alice.reserve("sim-board-1", keepalive=KEEPALIVE_S) as second:
        queued = _hold(url, env, "sim-board-0", "--queue", "--keepalive", f"{KEEPALIVE_S}s", user="bob")
        ticket = carol.reserve("sim-board-1", queue=True, keepalive=KEEPALIVE_S)
        follower = _hold(url, env, ticket.id, command=("ticket",), user="carol", *("--wait",))
        wait_for(lambda: [t for t in coordinator.api("/tickets", headers={"X-Device-Loop-User": "bob"}).json()
                          if t["state"] == "waiting"], what="bob's ticket")  # (the command made it)
        reaped_past_a_lapse(url, coordinator, "sim-board-0")  # the tickets' first lapse passed, and a reaper pass
    leases = [_printed_lease(process) for process in (queued, follower)]
    assert [lease["device"] for lease in leases] == ["sim-board-0", "sim-board-1"], "granted, not lapsed"
    for process in (queued, follower):
        process.stdin.close()
        assert process.wait(20) == 0, process.stderr.read()
    assert [lease_of(coordinator, lease["id"], user)["state"] for lease, user in zip(leases, ("bob", "carol"))] \
        == ["released", "released"]


def _printed_lease(process: subprocess.Popen) -> dict:
    """The lease the command printed (JSON over several lines), once it is ready."""
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.rstrip() == "}":
            break
    lease = json.loads("".join(lines))
    assert lease["ready"] and lease["keepalive_s"] == KEEPALIVE_S, lease
    return lease


def test_reserve_keepalive_holds_its_lease_until_its_input_ends_or_it_is_told_to_stop(lab):
    url, coordinator, env = lab
    idle(coordinator, "sim-board-0", "sim-board-1")
    by_input, by_signal = (_hold(url, env, name, "--keepalive", f"{KEEPALIVE_S}s") for name in ("sim-board-0",
                                                                                             "sim-board-1"))
    first, second = _printed_lease(by_input), _printed_lease(by_signal)
    reaped_past_a_lapse(url, coordinator, "sim-board-0")
    assert past(first["expires_at"], 0), "(the sentinel lapsed after the lease's first lapse)"
    assert lease_of(coordinator, first["id"])["state"] == "active", "it keeps its lease alive while it runs"
    by_input.stdin.close()  # (as a pipe's writer that exits does)
    by_signal.send_signal(signal.SIGTERM)
    for process, lease in ((by_input, first), (by_signal, second)):
        assert process.wait(20) == 0, process.stderr.read()
        assert f"{lease['id']} on {lease['device']} released" in process.stderr.read()
        assert lease_of(coordinator, lease["id"])["state"] == "released"


def test_reserve_keepalive_killed_frees_its_device_within_the_keepalive_and_a_lost_one_exits_75(lab):
    url, coordinator, env = lab
    idle(coordinator, "sim-board-0", "sim-board-1")
    killed, revoked = (_hold(url, env, name, "--keepalive", f"{KEEPALIVE_S}s") for name in ("sim-board-0",
                                                                                         "sim-board-1"))
    lease, other = _printed_lease(killed), _printed_lease(revoked)
    killed.kill()
    killed.wait(10)
    at = time.monotonic()
    assert coordinator.api(f"/admin/leases/{other['id']}/revoke", "POST").status_code == 200
    assert revoked.wait(KEEPALIVE_S + 5) == LAB_FAILURE_STATUS
    said = json.loads(revoked.stdout.read().strip().splitlines()[-1])
    assert said["error"] == "lease_ended" and said["message"].startswith("lab failure: ") and "revoked" in \
        said["message"], said
    ended = wait_for(lambda: (got := lease_of(coordinator, lease["id"]))["state"] == "expired" and got,
                     timeout=KEEPALIVE_S + 5, what="the killed client's lease to lapse")
    assert time.monotonic() - at <= KEEPALIVE_S + 2.5, "free within the keepalive and a reaper pass"
    assert ended["end_reason"] == f"its client stopped renewing (keepalive {KEEPALIVE_S}s)"
