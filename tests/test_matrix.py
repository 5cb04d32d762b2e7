"""Matrix jobs (docs/architecture.md, "Jobs and evidence"): the same A/B pair over device
groups, each cell on its own device and side by side; a group with no device waits its
``wait_s`` and is reported "not run: no device", never dropped."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import Exporter
from helpers import wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

WORKLOAD = "device-loop exec $DEVICE_LOOP_LEASE -- run-workload --cost {cost}"


def board(name: str, tag: str, isa: list[str], arch: str) -> dict:
    return {"name": name, "plugin": "sim", "class": "sim-board", "tags": [tag], "arch": arch, "isa": isa,
            "workload_s": 0.02, "seed": 3}


def cli(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "device_loop.cli", *args], env=env, capture_output=True, text=True,
                          timeout=90)


def test_a_matrix_over_three_groups_one_without_a_device(coordinator, tmp_path, env):
    exporter = Exporter(tmp_path, env, coordinator.url, [
        board("sve-board", "sve2", ["fp", "asimd", "sve", "sve2"], "aarch64"),
        board("rvv-board", "rvv", ["i", "m", "a", "f", "d", "c", "v"], "riscv64"),
        board("neon-board", "neon", ["fp", "asimd"], "aarch64")])
    try:
        for name in ("sve-board", "rvv-board", "neon-board"):
            wait_state(coordinator, name, "idle")
        held = coordinator.api("/leases", "POST", json={"device": "neon-board"}, headers={"X-Device-Loop-User": "bob"})
        assert held.status_code == 201, "bob holds the only neon board all along"
        env = {**env, "DEVICE_LOOP_COORDINATOR": coordinator.url}
        # the issue's own shape: --over and the groups after it, then "ab" and its options
        done = cli(env, "matrix", "--over", "tags=sve2", "tags=rvv", "tags=neon", "ab",
                   "--baseline", WORKLOAD.format(cost=1.0), "--patch", WORKLOAD.format(cost=0.95),
                   "--rounds", "1", "--warmup", "0", "--no-settle", "--cell-wait", "2s", "--title", "SIMD paths")
        assert done.returncode == 0, done.stdout + done.stderr
        table = done.stdout
        assert "Traceback" not in done.stderr
        job_id = table.split("evidence: device-loop job evidence ")[1].split()[0]
        assert "cell 0 tags=sve2 on sve-board" in table and "cell 1 tags=rvv on rvv-board" in table, table
        assert "cell 2 tags=neon: not run: no device" in table, table
        assert [line.split()[0] for line in table.splitlines() if line.startswith("workload_ms")] == \
            ["workload_ms"] * 2, "one row per cell that ran"

        job = json.loads(cli(env, "job", "show", job_id, "--json").stdout)
        assert job["state"] == "done" and job["spec"]["matrix"]["over"] == ["tags=sve2", "tags=rvv", "tags=neon"]
        cells = {c["cell"]: c for c in job["cells"]}
        assert cells[2]["not_run"] == "no device" and cells[2]["device"] is None
        assert {cells[0]["device"], cells[1]["device"]} == {"sve-board", "rvv-board"}
        assert "sve2" in cells[0]["fingerprint"]["isa"] and "v" in cells[1]["fingerprint"]["isa"]
        assert sorted((r["cell"], r["arm"]) for r in job["runs"]) == [(0, "A"), (0, "B"), (1, "A"), (1, "B")]
        first = {c: min(r["started_at"] for r in job["runs"] if r["cell"] == c) for c in (0, 1)}
        last = {c: max(r["ended_at"] for r in job["runs"] if r["cell"] == c) for c in (0, 1)}
        assert first[1] < last[0] and first[0] < last[1], "the two cells ran side by side"
        reservations = {r["cell"]: r for r in job["reservations"]}
        assert reservations[2]["ticket_state"] == "cancelled" and reservations[2]["lease"] is None, reservations
        assert all(reservations[c]["lease_state"] == "released" for c in (0, 1)), reservations

        evidence = cli(env, "job", "evidence", job_id).stdout
        assert "# SIMD paths" in evidence and "Not run: no device" in evidence, evidence
    finally:
        exporter.stop()


def test_matrix_refusals_are_usage_errors(env):
    for args, says in ((["--over", "colour=red"], "tags=a,b, class=C or device=D"),
                       (["--device", "d0", "--over", "tags=x"], "names a device"),
                       ([], "give the device groups"),
                       (["tags=x", "extra"], "tags=a,b, class=C or device=D")):
        done = cli(env, "matrix", *args, "--baseline", "a", "--patch", "b")
        assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
