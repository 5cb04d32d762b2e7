"""A plugin hook that never returns stops no heartbeat: discovery and health checks run
with a deadline (``[exporter] hook_timeout_s``), and a hung call is never started twice."""
import math
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from conftest import BUILT_IN_PLUGINS, Exporter, sim_devices, wait_for
from device_loop.core.plugins import LOAD_ENV
from device_loop.exporter.hook_deadlines import PARALLEL_CALLS, HookDeadlines, HookTimedOut, Returned
from helpers import reserve, wait_active, wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]
SCANS_WATCHED = 6  # heartbeats, each a scan, during which a hung call must not be started again

# Its first discovery finds its devices, every later one hangs; its health check hangs.
# Each call is written down, so that the test sees which calls were started.
STUCK_PLUGIN = """
    import os
    import threading

    from device_loop.plugin import hookimpl

    NEVER = threading.Event()
    calls = []


    def _note(what):
        calls.append(what)
        with open(os.environ["DEVLOOP_STUCK_CALLS"], "a") as out:
            out.write(what + "\\n")


    @hookimpl
    def devloop_discover(host):
        _note("discover")
        if calls.count("discover") > 1:
            NEVER.wait()
        return [entry.resource("stuck", f"stuck:{host.name}:{entry.device}") for entry in host.entries]


    @hookimpl
    def devloop_health(host, resource):
        _note("health")
        NEVER.wait()
"""


@pytest.fixture(scope="module")
def stuck_site(tmp_path_factory):
    """The plugin ``stuck``, pip-installed into a folder of its own."""
    root = tmp_path_factory.mktemp("stuck-plugin")
    (root / "devloop_stuck").mkdir()
    (root / "devloop_stuck" / "__init__.py").write_text(textwrap.dedent(STUCK_PLUGIN))
    (root / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "devloop-stuck"
        version = "0.1.0"
        [project.entry-points.device_loop]
        stuck = "devloop_stuck"
        [tool.setuptools]
        packages = ["devloop_stuck"]
    """))
    target = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--disable-pip-version-check",
                    "--target", str(target), str(root)], check=True, capture_output=True, timeout=120)
    return target


def test_a_hung_health_check_degrades_its_device_and_stops_no_heartbeat(tmp_path, env, coordinator, stuck_site):
    calls = tmp_path / "stuck-calls"
    calls.touch()
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(stuck_site), env.get("PYTHONPATH")])),
           LOAD_ENV: f"{BUILT_IN_PLUGINS},stuck",
           "DEVLOOP_STUCK_CALLS": str(calls)}
    devices = sim_devices("sim-board-0") + [{"name": "tar-pit", "class": "odd", "plugin": "stuck"}]
    heartbeat_s = 0.5
    exporter = Exporter(tmp_path, env, coordinator.url, devices, heartbeat_s=heartbeat_s, hook_timeout_s=1)
    try:
        stuck = wait_for(lambda: (lambda d: d if d.get("health") == "degraded" else None)(
            coordinator.api("/devices/tar-pit").json()), what="tar-pit degraded")
        assert stuck["health_reason"] == "stuck: health check timed out after 1 s", stuck
        assert stuck["state"] == "idle", "a check that hangs is no evidence the device is broken"

        def failing():
            (host,) = coordinator.api("/hosts").json()
            return {f["name"]: f["reason"] for f in host["plugins"]["failing"]}
        assert wait_for(lambda: failing().get("stuck"), what="stuck failing in hosts") == \
            "discovery timed out after 1 s; serving what it found before"

        wait_state(coordinator, "sim-board-0", "idle")
        lease = wait_active(coordinator, reserve(coordinator, "sim-board-0")["id"])
        assert lease["endpoints"], lease

        # heartbeats keep coming, each a scan (heartbeat_s 0.5), while both calls hang: watched
        # for as many scans as would each have started a hung discovery again
        ages: list[float] = []
        since = coordinator.api("/hosts").json()[0]["generation"]

        def scanned() -> bool:
            (host,) = coordinator.api("/hosts").json()
            assert host["online"], host
            ages.append(host["heartbeat_age_s"])
            return host["generation"] >= since + SCANS_WATCHED
        wait_for(scanned, interval=0.1, what=f"{SCANS_WATCHED} more heartbeats while both calls hang")
        assert max(ages) < 3 * heartbeat_s, f"a heartbeat came {max(ages)} s late"  # (3 periods: offline)
        assert calls.read_text().split() == ["discover", "health", "discover"], \
            "a call that had not returned was started again"
        assert coordinator.api("/devices/tar-pit").json()["health"] == "degraded"
        assert "has not returned after 1 s; not called again until it does" in exporter.output()
    finally:
        exporter.stop()


# ---- the mechanics, in process ---------------------------------------------------------

def test_a_call_past_its_deadline_times_out_and_is_not_started_again_until_it_returns():
    deadlines = HookDeadlines(timeout_s=0.2)
    release, started = threading.Event(), []

    def hangs():
        started.append(1)
        release.wait(10)
        return "late"

    first = deadlines.run({"hang": hangs, "quick": lambda: "fine"})
    assert first["quick"] == Returned("fine")
    with pytest.raises(HookTimedOut, match="timed out after 0.2 s"):
        first["hang"].result()

    again = deadlines.run({"hang": hangs})
    with pytest.raises(HookTimedOut):
        again["hang"].result()
    assert len(started) == 1 and deadlines.hung() == ["hang"]

    release.set()
    wait_for(lambda: not deadlines.hung(), what="the hung call's end noticed")
    release.clear()
    release.set()
    assert deadlines.run({"hang": hangs})["hang"] == Returned("late") and len(started) == 2


def test_a_crash_is_the_hooks_own_error_and_many_quick_calls_all_return():
    deadlines = HookDeadlines(timeout_s=5)

    def crashes():
        raise ValueError("no such thing")

    outcomes = deadlines.run({"crash": crashes, **{n: (lambda n=n: n * 2) for n in range(100)}})
    with pytest.raises(ValueError, match="no such thing"):
        outcomes["crash"].result()
    assert [outcomes[n].result() for n in range(100)] == [n * 2 for n in range(100)]


def test_hung_calls_hold_no_other_call_back_beyond_their_deadline():
    """More hung calls than run at once: the rest still run, each batch ends near one deadline."""
    deadlines = HookDeadlines(timeout_s=0.3)
    never = threading.Event()
    calls = {f"hung-{n}": never.wait for n in range(10)} | {f"ok-{n}": (lambda: "ok") for n in range(10)}
    began = time.monotonic()
    outcomes = deadlines.run(calls)
    took = time.monotonic() - began
    assert all(outcomes[f"ok-{n}"] == Returned("ok") for n in range(10))
    assert sum(isinstance(o, Returned) for o in outcomes.values()) == 10
    batches = math.ceil(len(calls) / PARALLEL_CALLS)
    assert took < (batches + 1) * deadlines.timeout_s, f"a batch with 10 hung calls took {took:.1f} s"
    began = time.monotonic()
    assert deadlines.run(calls)["ok-3"] == Returned("ok")
    assert time.monotonic() - began < deadlines.timeout_s, "calls still hung were waited for again"
    never.set()
