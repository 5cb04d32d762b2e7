"""Lab failures as the coordinator keeps them (docs/architecture.md, "Lab failures"): whose
failure each run and each cell's attempt was, stored and answered; attempts past the job's
retry refused; a retry's reserve leaves out the devices it names and says so when only
they match; two lab failures in a row on a device make it faulty (``lab-failures``) with a
line of its ring log, a run that is no lab failure sets the count back, an attempt the lab
failed before its first run counts too, one on a lease an admin revoked does not, and an
admin clears it. In-process, on SQLite and
on PostgreSQL where the suite has one."""
import pytest

from device_loop.coordinator.migrations import MIGRATIONS
from device_loop.coordinator.store import Store
from device_loop.coordinator.store.jobs import JobQueries
from lab_in_process import FakeExporter, device, in_process_lab
from lab_in_process import _database as fresh_database

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]

SPEC = {"target": {"class": "sim-board"}, "run": ["true"], "rounds": 3, "retry": 2}


def run(seq: int, attempt: int = 0, status: int = 0, failure: str | None = None) -> dict:
    return {"cell": 0, "attempt": attempt, "seq": seq, "arm": "run", "started_at": 1000.0 + seq,
            "ended_at": 1000.5 + seq, "status": status, "failure": failure}


async def started(api, spec=None) -> dict:
    """A job running with ``api``'s caller as its worker, on host-a's boards b0 and b1."""
    exporter = FakeExporter(api, "host-a")
    await exporter.beat([device("b0"), device("b1")])
    answer = await api.post("/jobs", json={"spec": spec or SPEC, "claim": True})
    assert answer.status_code == 201, answer.text
    return {**answer.json(), "exporter": exporter}


async def cell_on(api, job: dict, attempt: int, exclude=(), target=None) -> dict:
    """A lease for cell 0's ``attempt`` (of ``target``, default its class; leaving out
    ``exclude``), reported as that attempt's."""
    lease = await api.post(f"/jobs/{job['id']}/reserve", json={"cell": 0, **(target or {"class": "sim-board"}),
                                                               "exclude": list(exclude)})
    assert lease.status_code == 201 and "ticket" not in lease.json(), lease.text
    lease = lease.json()
    sent = await api.post(f"/jobs/{job['id']}/cells", json={"cell": 0, "attempt": attempt, "device": lease["device"],
                                                            "lease_id": lease["id"]})
    assert sent.status_code == 200, sent.text
    return lease


async def test_failures_and_attempts_are_stored_and_a_retry_leaves_the_failing_device_out(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        job = await started(api)
        first = await cell_on(api, job, 0)
        assert (await api.post(f"/jobs/{job['id']}/runs", json=run(0))).status_code == 201
        assert (await api.post(f"/jobs/{job['id']}/runs", json=run(1, status=75, failure="lab"))).status_code == 201
        ended = {"cell": 0, "attempt": 0, "device": first["device"], "lease_id": first["id"], "failure": "lab",
                 "reason": "run 1 exited 75"}
        assert (await api.post(f"/jobs/{job['id']}/cells", json=ended)).status_code == 200
        assert (await api.post(f"/leases/{first['id']}/release")).status_code == 200

        second = await cell_on(api, job, 1, exclude=[first["device"]])
        assert second["device"] != first["device"], "the retry's device is another"
        held = await api.post(f"/jobs/{job['id']}/reserve", json={"cell": 0, "class": "sim-board",
                                                                   "exclude": [first["device"]]})
        assert held.status_code == 409 and held.json()["error"] == "busy", "no ticket waits for the job's own"
        for seq in range(3):  # the attempt starts again from its first run
            assert (await api.post(f"/jobs/{job['id']}/runs", json=run(seq, attempt=1))).status_code == 201
        again = await api.post(f"/jobs/{job['id']}/runs", json=run(0, attempt=1))
        assert again.status_code == 409 and again.json()["error"] == "duplicate_run"
        past = await api.post(f"/jobs/{job['id']}/runs", json=run(0, attempt=3))
        assert past.status_code == 422 and "retry = 2" in past.json()["message"]
        bad = await api.post(f"/jobs/{job['id']}/runs", json=run(0, attempt=1, status=1, failure="nobody's"))
        assert bad.status_code == 422

        shown = (await api.get(f"/jobs/{job['id']}")).json()
        assert [(r["attempt"], r["seq"], r["failure"]) for r in shown["runs"]] == \
            [(0, 0, None), (0, 1, "lab"), (1, 0, None), (1, 1, None), (1, 2, None)]
        assert [(c["attempt"], c["device"], c["failure"], c["reason"]) for c in shown["cells"]] == \
            [(0, first["device"], "lab", "run 1 exited 75"), (1, second["device"], None, "")]
        cell = shown["analysis"]["cells"][0]
        assert (cell["device"], cell["counted"], cell["failed"]) == (second["device"], 3, 0), \
            "the analysis reads the cell's last attempt"

        # only the failing devices match: said so, not a ticket for one of them
        none = await api.post(f"/jobs/{job['id']}/reserve", json={"cell": 0, "class": "sim-board",
                                                                   "exclude": ["b0", "b1"]})
        assert none.status_code == 409 and none.json()["error"] == "no_other_device", none.text
        hostile = await api.post(f"/jobs/{job['id']}/reserve", json={"cell": 0, "class": "sim-board",
                                                                      "exclude": ["x"] * 6})
        assert hostile.status_code == 422
        for retry in (6, -1, 1.5, 10**30):
            refused = await api.post("/jobs", json={"spec": {**SPEC, "retry": retry}, "claim": True})
            assert refused.status_code == 422 and "retry" in refused.text, refused.text


async def test_two_lab_failures_in_a_row_make_a_device_faulty_until_an_admin_clears_it(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        job = await started(api, {**SPEC, "target": {"device": "b0"}, "rounds": 5})
        lease = await cell_on(api, job, 0)
        assert lease["device"] == "b0"
        await api.post(f"/jobs/{job['id']}/runs", json=run(0, status=75, failure="lab"))
        await api.post(f"/jobs/{job['id']}/runs", json=run(1, status=1, failure="test"))  # back to 0
        await api.post(f"/jobs/{job['id']}/runs", json=run(2, status=75, failure="lab"))
        assert (await api.get("/devices/b0")).json()["fault"] is None, "one lab failure in a row is no fault"
        await api.post(f"/jobs/{job['id']}/runs", json=run(3, status=124, failure="lab"))
        b0 = (await api.get("/devices/b0")).json()
        assert b0["fault_kind"] == "lab-failures" and "2 lab failures in a row" in b0["fault"], b0
        assert job["id"] in b0["fault"] and "exit status 124" in b0["fault"]
        log = (await api.get("/devices/b0/log")).json()
        assert any("2 lab failures in a row" in entry["cause"] for entry in log), "a line of its ring log, now"
        await api.post(f"/leases/{lease['id']}/release")
        await job["exporter"].beat([device("b0"), device("b1")])  # its service is gone: reclaimed
        assert (await api.get("/devices/b0")).json()["state"] == "faulty", "out of service once its lease ended"
        refused = await api.post("/leases", json={"device": "b0"})
        assert refused.status_code == 409 and "clear-fault" in refused.json()["message"]

        cleared = await api.post("/admin/devices/b0/clear-fault")
        assert cleared.status_code == 200 and cleared.json()["fault"] is None
        device_row = await rules.life.devices_sql.device("b0")
        assert device_row["lab_failures"] == 0, "cleared: its count starts again"


async def test_an_attempt_the_lab_failed_before_its_first_run_counts_against_its_device(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        job = await started(api, {**SPEC, "target": {"device": "b1"}})
        for attempt in (0, 1):
            lease = await cell_on(api, job, attempt, target={"device": "b1"}) if attempt == 0 else lease
            failed = {"cell": 0, "attempt": attempt, "device": "b1", "lease_id": lease["id"], "failure": "lab",
                      "reason": "b1 did not get ready"}
            for _ in range(2):  # the same report again counts once
                assert (await api.post(f"/jobs/{job['id']}/cells", json=failed)).status_code == 200
            fault = (await api.get("/devices/b1")).json()["fault"]
            assert (fault is None) == (attempt == 0), fault
        assert "b1 did not get ready" in fault

        # a worker that names another board than its lease's puts nothing out of service
        for attempt in (0, 1):
            lied = {"cell": 0, "attempt": attempt, "device": "b0", "lease_id": lease["id"], "failure": "lab",
                    "reason": "b0 is broken, believe me"}
            await api.post(f"/jobs/{job['id']}/cells", json={**lied, "failure": None})
            assert (await api.post(f"/jobs/{job['id']}/cells", json=lied)).status_code == 200
        assert (await rules.life.devices_sql.device("b0"))["lab_failures"] == 0


async def test_a_lab_failure_on_a_lease_a_person_ended_is_not_its_devices(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        job = await started(api, {**SPEC, "target": {"device": "b0"}})
        lease = await cell_on(api, job, 0)
        await api.post(f"/jobs/{job['id']}/runs", json=run(0, status=75, failure="lab"))
        assert (await rules.life.devices_sql.device("b0"))["lab_failures"] == 1
        assert (await api.post(f"/admin/leases/{lease['id']}/revoke")).status_code == 200
        await api.post(f"/jobs/{job['id']}/runs", json=run(1, status=1, failure="lab"))
        assert (await rules.life.devices_sql.device("b0"))["lab_failures"] == 1, "revoked: not the board's failure"
        assert (await api.get("/devices/b0")).json()["fault"] is None


async def test_runs_and_cells_of_before_attempts_are_kept_as_attempt_0(tmp_path, monkeypatch):
    """A database of the previous version (migration 22) keeps its runs and cells, each the
    first attempt of its cell."""
    from device_loop.coordinator.store import core

    async with fresh_database(tmp_path) as url:
        monkeypatch.setattr(core, "MIGRATIONS", MIGRATIONS[:22])
        old = Store(url)
        await old.connect()
        try:
            await old.run("INSERT INTO jobs (id, owner, kind, state, spec, created_at) VALUES ('job-1', 'ann', "
                          "'interactive', 'done', '{}', 0)")
            await old.run("INSERT INTO job_cells (job, cell, cell_group, device) VALUES ('job-1', 0, '', 'b0')")
            await old.run("INSERT INTO job_runs (job, cell, seq, arm, warmup, started_at, ended_at, status, readings, "
                          "samples, output_tail) VALUES ('job-1', 0, 0, 'run', FALSE, 1, 2, 3, '{}', '[]', 'x')")
        finally:
            await old.disconnect()
        monkeypatch.setattr(core, "MIGRATIONS", MIGRATIONS)
        new = Store(url)
        await new.connect()
        try:
            jobs = JobQueries(new)
            (cell,) = await jobs.job_cells("job-1")
            (stored,) = await jobs.job_runs("job-1")
            assert (cell["attempt"], cell["failure"], cell["reason"], cell["device"]) == (0, None, "", "b0")
            assert (stored["attempt"], stored["failure"], stored["status"]) == (0, None, 3)
        finally:
            await new.disconnect()
