"""A/B pairs on simulated boards (docs/architecture.md, "The A/B analysis"): the order of the
runs is fixed before the first one; with B truly 5 % cheaper, ABAB with settle recovers the
5 % and says faster, while AABB without settle, on the same seed, does not."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import Exporter
from device_loop.client.schedule import cells, measured_arms, warmup_arms
from device_loop.core.ab.jobs import ABSpec, JobSpec, Target, group_target
from helpers import wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


def ab(**fields) -> ABSpec:
    return ABSpec(baseline=["a"], patch=["b"], **fields)


def test_the_order_of_runs_is_fixed_by_the_spec_alone():
    assert "".join(warmup_arms(ab(warmup=2)) + measured_arms(ab(warmup=2), 0, 3)) == "ABABABABAB"
    assert "".join(measured_arms(ab(order="aabb"), 0, 3)) == "AAABBB"
    assert "".join(warmup_arms(ab(order="aabb"))) == "AB"
    shuffled = ab(order="random", seed=7, rounds=40)
    blocks = "".join(measured_arms(shuffled, 0, 40))
    assert sorted(blocks[i:i + 2] for i in range(0, 80, 2)) != ["AB"] * 40, "some blocks are BA"
    assert all(sorted(blocks[i:i + 2]) == ["A", "B"] for i in range(0, 80, 2)), "each block has one A and one B"
    assert blocks == "".join(measured_arms(shuffled, 0, 40)), "the same seed, the same order"
    assert blocks[:40] + "".join(measured_arms(shuffled, 20, 40)) == blocks, "a later look goes on where it stopped"
    assert blocks != "".join(measured_arms(ab(order="random", seed=8, rounds=40), 0, 40))


def test_matrix_groups_and_their_refusals():
    spec = JobSpec(target=Target(device_class="sim-board"), ab=ab(),
                   matrix={"over": ["tags=sve2", "tags=rvv,fast", "class=other", "device=d1"]})
    assert [(c.index, c.group, c.target.device_class, c.target.tags, c.target.device) for c in cells(spec)] == [
        (0, "tags=sve2", "sim-board", ["sve2"], None), (1, "tags=rvv,fast", "sim-board", ["rvv", "fast"], None),
        (2, "class=other", "other", [], None), (3, "device=d1", None, [], "d1")]
    for bad in ("sve2", "tags=", "colour=red", "=x"):
        with pytest.raises(ValueError, match="tags=a,b, class=C or device=D"):
            group_target(bad, Target())
    with pytest.raises(ValueError, match="names a device"):
        group_target("tags=x", Target(device="d0"))
    # refused in the spec itself (a job file, REST, MCP's submit_job), not when a worker runs it
    for over, target in ((["tags=a", "foo"], Target()), (["device=" + "d" * 65], Target()),
                         (["tags=" + ",".join(f"t{n}" for n in range(17))], Target()), (["tags=x"], Target(device="d0"))):
        with pytest.raises(ValueError):
            JobSpec(target=target, ab=ab(), matrix={"over": over})


# A board whose run-workload heats it fast (some 7 °C a run with its commands) and throttles
# above 64 °C, 5 % slower a degree above it, and whose cooldown (its settle step) waits for
# < 62 °C: ABAB with settle starts every run below the knee, while AABB without settle heats it
# run after run, so its B half runs throttled. The cooldown reads the board once a second
# (exporter/steps.py, POLL_S), so ABAB's time is its rounds' readings: with the knee 24 °C above
# the ambient and a tau of 7 s, a run's heat is shed in one or two of them and ABAB takes some
# 19 s, where the first model here (knee 55 °C, cooldown below 53 °C, tau 8 s, 2 % a degree)
# took three a round, 31 s. As the model plays it (the same seed), AABB still misleads with its
# runs up to some 1.4 s apart (0.4 s on an idle machine, 0.5 s beside two busy loops; the first
# model up to some 2.2 s): beyond, the board cools by itself between runs. Runs back to back
# (0.35 s apart) take it to some 150 °C, within what a thermal zone can read: plugins/sim/
# workload.py's first model (work_heat 120) had it past 250 °C once the runs came 0.2 s apart,
# and read as no temperature.
HOT_BOARD = {"plugin": "sim", "class": "sim-board", "ambient": 40, "tau": "7s", "workload_s": 0.1, "work_heat": 60,
             "throttle_above": 64, "throttle_per_c": 0.05, "noise": 0.01, "seed": 20,
             "steps": [{"step": "cooldown", "below": "62C", "timeout": "60s"}]}
WORKLOAD = "device-loop exec $DEVICE_LOOP_LEASE -- run-workload --cost {cost}"


def ab_cli(env, coordinator, device: str, *options: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "device_loop.cli", "ab", "--coordinator", coordinator.url,
                             "--device", device, "--baseline", WORKLOAD.format(cost=1.0),
                             "--patch", WORKLOAD.format(cost=0.95), "--rounds", "6", "--warmup", "0",
                             "--metric", "workload_ms:lower:ms", "--json", *options],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_abab_with_settle_finds_the_5_percent_and_aabb_without_it_does_not(coordinator, tmp_path, env):
    exporter = Exporter(tmp_path, env, coordinator.url, [{"name": name, **HOT_BOARD} for name in ("abab", "aabb")])
    try:
        for name in ("abab", "aabb"):
            wait_state(coordinator, name, "idle")
        # the same board (its seed, its model), one job each, side by side
        jobs = {"abab": ab_cli(env, coordinator, "abab", "--order", "abab"),
                "aabb": ab_cli(env, coordinator, "aabb", "--order", "aabb", "--no-settle")}
        said = {name: job.communicate(timeout=100) for name, job in jobs.items()}
        answers = {}
        for name, (out, err) in said.items():
            assert jobs[name].returncode == 0, f"{name}: {out}\n{err}"
            answers[name] = json.loads(out)
    finally:
        exporter.stop()
    for name, answer in answers.items():
        assert answer["id"].startswith("job-") and answer["state"] == "done"
        assert [r["arm"] for r in answer["runs"]] == list("ABABABABABAB" if name == "abab" else "AAAAAABBBBBB")
        unread = [(i, r["readings"]) for i, r in enumerate(answer["runs"]) if not r["readings"]["temperatures"]]
        assert not unread, f"{name}: each run's start temperature; not read in runs {unread}"
        assert answer["cells"][0]["fingerprint"]["channel"] == "console"

    (cell,) = answers["abab"]["analysis"]["cells"]
    (metric,) = cell["metrics"]
    right = metric["comparison"]
    assert right["verdict"] == "different" and right["words"].startswith("B is") and "faster" in right["words"]
    assert right["low"] <= 0.95 <= right["high"], right

    (metric,) = answers["aabb"]["analysis"]["cells"][0]["metrics"]
    wrong = metric["comparison"]
    says_faster = wrong["verdict"] == "different" and "faster" in wrong["words"]
    finds_5_percent = wrong["low"] is not None and wrong["low"] <= 0.95 <= wrong["high"]
    assert not says_faster or not finds_5_percent, f"AABB without settle should mislead on this model: {wrong}"
    hottest = {name: max(t for r in answer["runs"] for t in r["readings"]["temperatures"].values())
               for name, answer in answers.items()}
    knee = HOT_BOARD["throttle_above"]
    assert hottest["aabb"] > knee > hottest["abab"], f"the B half of AABB ran throttled, no run of ABAB: {hottest}"
