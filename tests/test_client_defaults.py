"""The clients send no default of their own: a reserve without a TTL, from the CLI or the
Python client, gets the lab's (its coordinator's ``--default-ttl``), not a 30 minutes
written into the client."""
import json
import subprocess
import sys

import pytest

from conftest import Coordinator, Exporter, sim_devices, wait_for
from device_loop.client import Lab
from device_loop.core.durations import parse_iso

pytestmark = pytest.mark.timeout(90)

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
