"""The Python client as a new user meets it. It sends no default of its own (a reserve
without a TTL, from the CLI or the library, gets the lab's ``--default-ttl``, not a 30
minutes written into the client); what it returns is typed as the coordinator answers
(``core/answers.py``), an operation is an ``Operation``, and each object prints as what it is."""
import json
import subprocess
import sys

import pytest

from conftest import Coordinator, Exporter, sim_devices, wait_for
from device_loop.client import Lab
from device_loop.client.lab import Lease, Operation, Ticket
from device_loop.core.answers import DeviceAnswer, LeaseAnswer, OperationAnswer
from device_loop.core.durations import parse_iso

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]

LAB_DEFAULT_S = 7 * 60  # not the coordinator's own default (30 min), nor any client's


@pytest.fixture
def lab(tmp_path, env):
    """A coordinator whose default TTL is 7 minutes, with two simulated boards: its URL."""
    coordinator = Coordinator(tmp_path, env, extra=("--single-user", "--default-ttl", "7m"))
    exporter = Exporter(tmp_path, env, coordinator.url, sim_devices("sim-board-0", "sim-board-1"))
    try:
        wait_for(lambda: {d["name"]: d["state"] for d in coordinator.api("/devices").json()}
                 == {"sim-board-0": "idle", "sim-board-1": "idle"}, what="both boards idle")
        yield coordinator.url
    finally:
        exporter.stop()
        coordinator.stop()


def _ttl_s(lease: dict) -> float:
    return parse_iso(lease["expires_at"]) - parse_iso(lease["created_at"])


def test_a_reserve_without_a_ttl_gets_the_labs_default(lab, env):
    cli = subprocess.run([sys.executable, "-m", "device_loop.cli", "--coordinator", lab, "reserve", "sim-board-0",
                          "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert _ttl_s(json.loads(cli.stdout)) == pytest.approx(LAB_DEFAULT_S, abs=1)

    lease = Lab(lab, user="bob").reserve("sim-board-1")
    assert _ttl_s(lease.data) == pytest.approx(LAB_DEFAULT_S, abs=1)


def test_a_ttl_asked_for_is_sent(lab, env):
    lease = Lab(lab, user="bob").reserve("sim-board-1", ttl="90s")
    assert _ttl_s(lease.data) == pytest.approx(90, abs=1)


def test_what_the_client_returns_is_typed_and_prints_as_what_it_is(lab):
    client = Lab(lab, user="bob")
    assert repr(client) == f"<Lab {lab} as bob>"
    devices = client.devices()
    assert {d["name"] for d in devices} == {"sim-board-0", "sim-board-1"}
    assert all(set(d) <= set(DeviceAnswer.__annotations__) for d in devices)

    with client.reserve("sim-board-0", ttl="5m") as lease:
        assert isinstance(lease, Lease) and set(lease.data) == set(LeaseAnswer.__annotations__)
        assert repr(lease).startswith(f"<Lease {lease.id} on sim-board-0, active, ready, expires 20")
        settled = lease.settle()
        assert isinstance(settled, Operation) and settled.state == "done" and settled.kind == "settle"
        assert set(settled.data) <= set(OperationAnswer.__annotations__)
        assert repr(settled) == f"<Operation {settled.id} settle on sim-board-0, done: {settled.message}>"
        assert [op.id for op in client.operations("sim-board-0")] == [settled.id]
        assert client.op(settled.id).state == "done"

        ticket = Lab(lab, user="carol").reserve("sim-board-0", queue=True)  # bob holds it: a place in the queue
        assert isinstance(ticket, Ticket)
        assert repr(ticket) == f"<Ticket {ticket.id} for {ticket.data['wants']}, waiting, position 1>"
        ticket.cancel()
    assert repr(lease).startswith(f"<Lease {lease.id} on sim-board-0, released, expires ")
