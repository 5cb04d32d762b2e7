"""Health that heals on a simulated board, with a real exporter and coordinator on SQLite
and on PostgreSQL (docs/architecture.md, "Health that heals"): the board's health is made to
fail and recover through its health file (plugins/sim)."""
import pytest

from conftest import WAIT_S, Coordinator, Exporter, sim_devices, wait_for
from helpers import device, reserve, run_cli, wait_active, wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

BOARD = "sim-board-0"
STEPPED = {"name": "stepped", "plugin": "sim", "class": "sim-board",  # a board whose step between leases fails
           "steps": [{"step": "command", "command": ["sh", "-c", "echo no luck >&2; exit 3"], "timeout": "10s"}]}
# short periods, and a heartbeat far longer: a change is seen by the health schedule's own wake-ups.
# A quarantine's probes come 0.2, 0.4, 0.8 s apart, then 1 s, the ceiling (not 1.6 s): the
# ceiling is also how long a test has to see the board still faulty between its good probes
SCHEDULE = {"health_period": 0.2, "health_recheck": 0.1, "quarantine_window": "10m", "quarantine_ceiling": 1.0}
# the longest an exporter allows: no heartbeat (no scan) comes during a test, however long the
# machine makes it, so whatever reports a change between a lab's start and its end is the schedule
HEARTBEAT_S = 3600.0


@pytest.fixture(params=["sqlite", "postgresql"])
def lab(request, tmp_path, env):
    """A coordinator (on each database) and an exporter with one simulated board."""
    extra: tuple[str, ...] = ("--single-user",)
    if request.param == "postgresql":
        extra += ("--database-url", request.getfixturevalue("postgres_database"))
    coordinator = Coordinator(tmp_path, env, extra=extra)
    exporter = Exporter(tmp_path, env, coordinator.url, sim_devices(BOARD) + [STEPPED], heartbeat_s=HEARTBEAT_S,
                        **SCHEDULE)
    try:
        wait_state(coordinator, BOARD, "idle")
        wait_state(coordinator, "stepped", "idle")
        yield coordinator, exporter
    finally:
        exporter.stop()
        coordinator.stop()


def set_health(exporter: Exporter, words: str, board: str = BOARD) -> None:
    """What the board's health file says (``ok`` is its own health)."""
    path = exporter.state_dir / "sim" / f"{board}.health"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(words)
    partial.replace(path)  # (whole: the exporter never reads half a word)


def test_a_failure_is_reported_between_heartbeats(lab):
    coordinator, exporter = lab
    set_health(exporter, "failed transient link down")
    wait_state(coordinator, BOARD, "faulty")  # no heartbeat comes: the re-check reported it
    row = device(coordinator, BOARD)
    assert row["health"] == "failed" and "link down" in row["health_reason"], row
    set_health(exporter, "ok")
    wait_state(coordinator, BOARD, "idle")


def log_causes(coordinator) -> list[str]:
    return [e["cause"] for e in coordinator.api(f"/devices/{BOARD}/log").json()]


def wait_line(coordinator, line: str, timeout: float = WAIT_S) -> None:
    wait_for(lambda: line in log_causes(coordinator), timeout, what=f"ring log line {line!r}")


def test_a_board_that_keeps_failing_is_quarantined_probed_later_and_later_and_re_admitted(lab):
    coordinator, exporter = lab
    for _ in range(2):
        set_health(exporter, "failed transient link down")
        wait_state(coordinator, BOARD, "faulty")
        set_health(exporter, "ok")
        wait_state(coordinator, BOARD, "idle")
    assert device(coordinator, BOARD)["quarantine"] is None
    set_health(exporter, "failed transient link down")
    wait_line(coordinator, "quarantine: failed 3 times in 10 min; next probe in 0.2 s")
    shown = device(coordinator, BOARD)
    assert shown["state"] == "faulty" and shown["quarantine"]["needed"] == 3, shown
    assert shown["reason"].startswith("quarantined: "), shown
    for interval in ("0.4 s", "0.8 s", "1 s"):  # doubled after each failed probe, up to the ceiling
        wait_line(coordinator, f"quarantine: probe failed (link down); next probe in {interval}")
    set_health(exporter, "ok")
    for good in (1, 2):
        wait_line(coordinator, f"quarantine: probe {good} of 3 good")
        assert device(coordinator, BOARD)["state"] == "faulty", "faulty until re-admitted"
    wait_line(coordinator, "re-admitted after 3 good probes")
    shown = device(coordinator, BOARD)
    assert (shown["state"], shown["quarantine"], shown["fault"]) == ("idle", None, None), "no admin needed"
    ls = run_cli(exporter.env, coordinator.url, "ls").stdout
    assert BOARD in ls and "quarantined" not in ls


def test_a_holder_s_panics_inside_the_lease_neither_quarantine_the_board_nor_count_after_it(lab):
    coordinator, exporter = lab
    lease = wait_active(coordinator, reserve(coordinator, BOARD)["id"])
    for _ in range(3):  # the holder's own image panics the board three times
        set_health(exporter, "failed transient kernel panic")
        wait_for(lambda: device(coordinator, BOARD)["health"] == "failed", what="health failed")
        set_health(exporter, "ok")
        wait_for(lambda: device(coordinator, BOARD)["health"] == "ok", what="health ok again")
    shown = device(coordinator, BOARD)
    assert (shown["state"], shown["quarantine"]) == ("in_use", None), "no quarantine during the lease"
    assert coordinator.api(f"/leases/{lease['id']}/release", "POST").status_code == 200
    wait_state(coordinator, BOARD, "idle")
    set_health(exporter, "failed transient link down")  # the lab's own, with the three of the lease: four
    wait_state(coordinator, BOARD, "faulty")
    set_health(exporter, "ok")
    wait_state(coordinator, BOARD, "idle")
    assert not [c for c in log_causes(coordinator) if "quarantine" in c], "the lease's three did not count after it"


def test_a_permanent_failure_and_a_person_s_fault_stay_until_an_admin_clears_them(lab):
    coordinator, exporter = lab
    set_health(exporter, "failed permanent AER fatal errors: 3")
    wait_state(coordinator, BOARD, "faulty")
    shown = device(coordinator, BOARD)
    assert (shown["fault_kind"], shown["fault"]) == ("health-permanent",
                                                     "health failed for good: uart: AER fatal errors: 3"), shown
    set_health(exporter, "ok")
    wait_for(lambda: device(coordinator, BOARD)["health"] == "ok", what="health ok again")
    assert device(coordinator, BOARD)["state"] == "faulty", "a permanent fault waits for a person"
    run_cli(exporter.env, coordinator.url, "admin", "clear-fault", BOARD)
    wait_state(coordinator, BOARD, "idle")

    marked = run_cli(exporter.env, coordinator.url, "admin", "fault", BOARD, "--reason", "fan rattles")
    assert f"{BOARD} is faulty" in marked.stdout
    set_health(exporter, "failed transient link down")
    wait_for(lambda: device(coordinator, BOARD)["health"] == "failed", what="health failed")
    set_health(exporter, "ok")
    wait_for(lambda: device(coordinator, BOARD)["health"] == "ok", what="health ok again")
    shown = device(coordinator, BOARD)
    assert (shown["state"], shown["fault_kind"]) == ("faulty", "marked-faulty"), "a person's fault stays"
    ls = run_cli(exporter.env, coordinator.url, "ls").stdout
    assert "marked faulty by admin" in ls, ls
    run_cli(exporter.env, coordinator.url, "admin", "clear-fault", BOARD)
    wait_state(coordinator, BOARD, "idle")


def test_a_failed_step_s_fault_stays_when_health_fails_and_recovers(lab):
    coordinator, exporter = lab
    lease = wait_active(coordinator, reserve(coordinator, "stepped")["id"])
    assert coordinator.api(f"/leases/{lease['id']}/release", "POST").status_code == 200
    wait_state(coordinator, "stepped", "faulty")
    assert device(coordinator, "stepped")["fault_kind"] == "step-failed"
    set_health(exporter, "failed transient link down", board="stepped")
    wait_for(lambda: device(coordinator, "stepped")["health"] == "failed", what="health failed")
    set_health(exporter, "ok", board="stepped")
    wait_for(lambda: device(coordinator, "stepped")["health"] == "ok", what="health ok again")
    shown = device(coordinator, "stepped")
    assert (shown["state"], shown["fault_kind"]) == ("faulty", "step-failed"), "a step's fault stays"
    assert coordinator.api("/admin/devices/stepped/clear-fault", "POST").json()["state"] == "idle"
