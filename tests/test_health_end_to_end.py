"""Health that heals on a simulated board, with a real exporter and coordinator on SQLite
and on PostgreSQL (docs/architecture.md, "Health that heals"): the board's health is made to
fail and recover through its health file (plugins/sim)."""
import pytest

from conftest import Coordinator, Exporter, sim_devices, wait_for
from helpers import device, wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

BOARD = "sim-board-0"
# short periods, and a heartbeat far longer: a change is seen by the health schedule's own wake-ups
SCHEDULE = {"health_period": 0.4, "health_recheck": 0.2, "quarantine_window": "10m", "quarantine_ceiling": 1.6}


@pytest.fixture(params=["sqlite", "postgresql"])
def lab(request, tmp_path, env):
    """A coordinator (on each database) and an exporter with one simulated board."""
    extra: tuple[str, ...] = ("--single-user",)
    if request.param == "postgresql":
        extra += ("--database-url", request.getfixturevalue("postgres_database"))
    coordinator = Coordinator(tmp_path, env, extra=extra)
    exporter = Exporter(tmp_path, env, coordinator.url, sim_devices(BOARD), heartbeat_s=30, **SCHEDULE)
    try:
        wait_state(coordinator, BOARD, "idle", timeout=30)
        yield coordinator, exporter
    finally:
        exporter.stop()
        coordinator.stop()


def set_health(exporter: Exporter, words: str) -> None:
    """What the board's health file says (``ok`` is its own health)."""
    path = exporter.state_dir / "sim" / f"{BOARD}.health"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(words)
    partial.replace(path)  # (whole: the exporter never reads half a word)


def test_a_failure_is_reported_between_heartbeats(lab):
    coordinator, exporter = lab
    set_health(exporter, "failed transient link down")
    wait_state(coordinator, BOARD, "faulty", timeout=10)  # a heartbeat is 30 s away: the re-check reported it
    row = device(coordinator, BOARD)
    assert row["health"] == "failed" and "link down" in row["health_reason"], row
    set_health(exporter, "ok")
    wait_state(coordinator, BOARD, "idle", timeout=10)
