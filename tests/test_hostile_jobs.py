"""Hostile input to the job routes (a spec comes from a user or an agent, a run from a worker
whose token can be stolen): every refusal a clear 4xx, and nothing stored."""
import pytest

from device_loop.coordinator.identity import issue_token
from device_loop.core.ab.jobs import COLDEST_C, HOTTEST_C, LATEST_TIME_S, MAX_COMMANDS, MAX_MEASURE, RunRecord
from lab_in_process import FakeExporter, device, in_process_lab
from test_metric_regex_cost import HOSTILE, ORDINARY

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]

SPEC = {"target": {"class": "sim-board"}, "run": ["true"], "rounds": 3}


def run(seq: int, **more) -> dict:
    return {"seq": seq, "arm": "run", "started_at": 1.0, "ended_at": 2.0, "status": 0, **more}


async def counts(rules) -> dict[str, int]:
    return {table: (await rules.store.read(f"SELECT COUNT(*) AS n FROM {table}"))[0]["n"]
            for table in ("jobs", "job_runs", "job_cells", "job_leases", "tickets", "leases")}


async def people(rules, clock, client):
    t = {n: (await issue_token(rules.store, clock, n, admin=n == "root"))["token"] for n in ("ann", "eve", "root")}
    return {n: client(token=token) for n, token in t.items()}


async def test_a_bad_spec_is_refused_and_nothing_is_stored(tmp_path):
    async with in_process_lab(tmp_path, max_ttl_s=7200) as (client, rules, clock):
        api = client()
        bad = {
            "unknown field": {**SPEC, "shell": "rm -rf /"},
            "unknown nested field": {**SPEC, "target": {"class": "x", "host": "y"}},
            "nothing to run": {"target": {"class": "x"}},
            "too many commands": {**SPEC, "run": ["true"] * (MAX_COMMANDS + 1)},
            "a command too long": {**SPEC, "run": ["x" * 2001]},
            "too many rounds": {**SPEC, "rounds": 201},
            "a matrix without a pair": {**SPEC, "matrix": {"over": ["tags=a"]}},
            "a regex without its group": {**SPEC, "metrics": [{"name": "ms", "regex": "([0-9]+)"}]},
            "a regex RE2 does not read": {**SPEC, "metrics": [{"name": "ms", "regex": "(?=x)(?P<value>[0-9]+)"}]},
            # (at every place in a MiB of output: 7 s a stream and metric, for nothing)
            "a regex that matches empty text": {**SPEC, "metrics": [{"name": "ms", "regex": "(?P<value>a*)"}]},
            "a spec that is no object": ["true"],
            "a number for text": {**SPEC, "title": 5},
        }
        for why, spec in bad.items():
            refused = await api.post("/jobs", json={"spec": spec})
            assert refused.status_code == 422, f"{why}: {refused.text}"
        backreference = await api.post("/jobs", json={"spec": {**SPEC, "metrics": [
            {"name": "decode_ms", "regex": r"(?P<value>[0-9]+) \1"}]}})
        assert "metric decode_ms" in backreference.json()["message"] and "RE2" in backreference.json()["message"]
        refused = await api.post("/jobs", json={"spec": {**SPEC, "lease_ttl_s": 7201}})
        assert refused.status_code == 422 and refused.json()["error"] == "ttl_too_long"
        assert (await api.post("/jobs", json={"spec": SPEC, "claim": True, "worker": "a\nb"})).status_code == 422
        assert (await api.post("/jobs", json={"spec": SPEC, "claim": "yes"})).status_code == 422
        assert (await api.post("/jobs", json={"spec": SPEC, "extra": 1})).status_code == 422
        huge = await api.post("/jobs", content=b'{"spec": {"title": "' + b"x" * (1 << 20) + b'"}}',
                              headers={"Content-Type": "application/json"})
        assert huge.status_code == 413
        assert (await counts(rules))["jobs"] == 0


async def test_a_regex_that_could_hold_a_worker_is_refused_and_those_people_write_are_not(tmp_path):
    """RE2 works at each byte for each place of a regex that can be matching there: these
    held a worker 26.6 s over 64 KiB of output, 16.8 s over 64 KiB, 8.6 s over a MiB
    (tests/test_metric_regex_cost.py has the bound, and the worker's side)."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        for regex in HOSTILE:
            refused = await api.post("/jobs", json={"spec": {**SPEC, "metrics": [{"name": "decode_ms", "regex": regex}]}})
            assert refused.status_code == 422, f"{regex}: {refused.text}"
            assert ("metric decode_ms: a worker reads its regex with RE2, which would work too hard at it: "
                    in refused.json()["message"]), refused.json()["message"]
        assert (await counts(rules))["jobs"] == 0
        for regex in ORDINARY:
            taken = await api.post("/jobs", json={"spec": {**SPEC, "metrics": [{"name": "decode_ms", "regex": regex}]}})
            assert taken.status_code == 201, f"{regex}: {taken.text}"


async def test_another_users_job_is_not_there_for_them(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        p = await people(rules, clock, client)
        job = (await p["ann"].post("/jobs", json={"spec": SPEC, "claim": True})).json()
        before = await counts(rules)
        eve = p["eve"]
        for method, path, body in [("GET", "", None), ("GET", "/evidence", None), ("POST", "/beat", {}),
                                   ("POST", "/reserve", {"class": "sim-board"}), ("POST", "/cells", {"cell": 0}),
                                   ("POST", "/runs", run(0)), ("POST", "/finish", {"state": "done"}),
                                   ("POST", "/cancel", {})]:
            answer = await eve.request(method, f"/jobs/{job['id']}{path}", json=body)
            assert answer.status_code == 404 and answer.json()["error"] == "unknown_job", (path, answer.text)
        assert (await eve.get("/jobs")).json() == []
        assert [j["id"] for j in (await eve.get("/jobs", params={"all": "true"})).json()] == [], "admins only"
        refused = await eve.post("/jobs/claim", json={"users": ["ann"]})
        assert refused.status_code == 403 and "admin" in refused.json()["message"]
        assert (await counts(rules)) == before
        assert (await p["ann"].get(f"/jobs/{job['id']}")).json()["state"] == "running", "nothing changed"


async def test_runs_are_append_only_bounded_and_only_while_the_job_runs(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        job = (await api.post("/jobs", json={"spec": SPEC, "claim": True})).json()
        runs = f"/jobs/{job['id']}/runs"
        assert (await api.post(runs, json=run(0))).status_code == 201
        duplicate = await api.post(runs, json=run(0, status=1))
        assert duplicate.status_code == 409 and duplicate.json()["error"] == "duplicate_run"
        past = await api.post(runs, json=run(3))  # three rounds of one command: seq 0 to 2
        assert past.status_code == 409 and past.json()["error"] == "too_many_runs"
        assert (await api.post(runs, json=run(1, cell=1))).json()["error"] == "no_such_cell"
        assert (await api.post(f"/jobs/{job['id']}/cells", json={"cell": 1})).json()["error"] == "no_such_cell"
        for bad in [run(1, arm="C"), run(1, status=999), {**run(1), "seq": -1}, {**run(1), "extra": 1},
                    run(1, samples=[{"metric": "bad name!", "value": 1}]), run(1, output_tail="x" * 4001),
                    run(1, samples=[{"metric": "m", "value": 1}] * 17), run(1, started_at="now"),
                    run(1, started_at=-1e308), run(1, ended_at=1e308), run(1, started_at=-1.0),
                    run(1, ended_at=LATEST_TIME_S + 1)]:
            assert (await api.post(runs, json=bad)).status_code == 422, bad
        nan = await api.post(runs, content=b'{"seq": 1, "arm": "run", "started_at": NaN, "ended_at": 2, "status": 0}',
                             headers={"Content-Type": "application/json"})
        assert nan.status_code == 422
        big = await api.post(runs, json=run(1, readings={"unfit": "x" * 4000, "temperatures": {
            f"zone{n}": 1.0 for n in range(10000)}}))
        assert big.status_code == 413
        assert (await api.post(f"/jobs/{job['id']}/finish", json={"state": "running"})).status_code == 422
        assert (await api.post(f"/jobs/{job['id']}/finish", json={"state": "done"})).status_code == 200
        ended = await api.post(runs, json=run(1))
        assert ended.status_code == 409 and ended.json()["error"] == "job_not_running"
        assert (await api.post(f"/jobs/{job['id']}/cancel")).json()["error"] == "job_ended"
        assert (await api.post(f"/jobs/{job['id']}/finish", json={"state": "failed"})).status_code == 409
        assert [r["seq"] for r in (await api.get(f"/jobs/{job['id']}")).json()["runs"]] == [0]


async def test_a_queued_job_takes_nothing_from_anyone_but_its_worker(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([device("b0")])
        job = (await api.post("/jobs", json={"spec": SPEC})).json()
        before = await counts(rules)
        for path, body in [("/reserve", {"device": "b0"}), ("/runs", run(0)), ("/cells", {"cell": 0}),
                           ("/beat", {}), ("/finish", {"state": "done"})]:
            answer = await api.post(f"/jobs/{job['id']}{path}", json=body)
            assert answer.status_code == 403 and answer.json()["error"] == "not_the_worker", (path, answer.text)
        assert await counts(rules) == before


async def test_bad_waits_and_claims_are_refused(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        job = (await api.post("/jobs", json={"spec": SPEC})).json()
        for params in ({"wait": -1}, {"wait": 61}, {"wait": "soon"}, {"wait": "nan"}, {"wait": 5, "unless": "x" * 33}):
            assert (await api.get(f"/jobs/{job['id']}", params=params)).status_code == 400, params
        other = await api.get(f"/jobs/{job['id']}", params={"wait": 30, "unless": "bogus"})
        assert other.json()["state"] == "queued", "a state it is not in: the answer comes at once"
        for body in ({"wait_s": 61}, {"wait_s": -1}, {"wait_s": "5"}, {"users": "alice"}, {"users": ["bad name"]},
                     {"users": [f"u{n}" for n in range(65)]}, {"worker": "x" * 201}, {"worker": ""}):
            assert (await api.post("/jobs/claim", json=body)).status_code == 422, body
        assert (await api.get("/jobs/" + "j" * 65)).status_code == 400
        assert (await api.get("/jobs/" + "j" * 65 + "/evidence")).status_code == 400
        assert (await api.get(f"/jobs/{job['id']}")).json()["state"] == "queued", "no claim went through"


async def test_a_person_has_a_bounded_number_of_open_jobs_and_a_job_of_reservations(tmp_path):
    from device_loop.coordinator.jobs import MAX_OPEN_JOBS, RESERVATIONS_PER_CELL

    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([device(f"b{n}") for n in range(RESERVATIONS_PER_CELL + 1)])
        first = (await api.post("/jobs", json={"spec": SPEC, "claim": True})).json()
        for _ in range(MAX_OPEN_JOBS - 1):
            assert (await api.post("/jobs", json={"spec": SPEC})).status_code == 201
        refused = await api.post("/jobs", json={"spec": SPEC})
        assert refused.status_code == 409 and refused.json()["error"] == "too_many_jobs"
        assert (await counts(rules))["jobs"] == MAX_OPEN_JOBS

        for n in range(RESERVATIONS_PER_CELL):
            assert (await api.post(f"/jobs/{first['id']}/reserve", json={"device": f"b{n}"})).status_code == 201
        more = await api.post(f"/jobs/{first['id']}/reserve", json={"device": f"b{RESERVATIONS_PER_CELL}"})
        assert more.status_code == 409 and more.json()["error"] == "too_many_reservations"
        assert (await counts(rules))["leases"] == RESERVATIONS_PER_CELL

        await api.post(f"/jobs/{first['id']}/finish", json={"state": "done"})  # an ended job is no longer counted
        assert (await api.post("/jobs", json={"spec": SPEC})).status_code == 201


async def test_a_run_of_any_numbers_it_may_hold_reads_and_shows_and_an_old_bad_one_too(tmp_path):
    """The extremes a run may report render and are analysed (its page, its evidence, an A/B
    pair's finish); past them a run is refused; and a run stored before its numbers were
    bounded (started_at -1e308, a zone at 1.7e308: every view failed with 500) reads as one."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        spec = {"target": {"class": "sim-board"}, "metrics": [{"name": "m"}],
                "ab": {"baseline": ["true"], "patch": ["true"], "rounds": 4, "warmup": 0}}
        job = (await api.post("/jobs", json={"spec": spec, "claim": True})).json()

        def extreme(seq: int, sign: int) -> dict:
            return {**run(seq, arm="AB"[seq % 2], started_at=0.0, ended_at=LATEST_TIME_S),
                    "samples": [{"metric": "m", "value": sign * MAX_MEASURE}],
                    "readings": {"temperatures": {"cpu": HOTTEST_C, "gpu": COLDEST_C}, "load": 1e6, "freq_khz": 10**9}}

        for seq in range(6):
            assert (await api.post(f"/jobs/{job['id']}/runs", json=extreme(seq, (-1) ** seq))).status_code == 201
        for past in ({"samples": [{"metric": "m", "value": 1.7e308}]}, {"readings": {"temperatures": {"z": 1.7e308}}},
                     {"readings": {"temperatures": {"z": -300.0}}}):
            assert (await api.post(f"/jobs/{job['id']}/runs", json={**extreme(6, 1), **past})).status_code == 422, past
        old = RunRecord.model_validate(extreme(6, 1)).model_dump(mode="json") | {"started_at": -1e308,
                                                                                 "ended_at": 1e308}
        old["samples"][0]["value"] = 1.7e308
        old["readings"]["temperatures"] = {"z": 1.7e308}
        assert await rules.jobs.jobs_sql.insert_job_run({"job": job["id"], **old})
        assert await rules.jobs.jobs_sql.insert_job_run({"job": job["id"], **old, "seq": 7})
        answer = await api.get(f"/jobs/{job['id']}")
        assert answer.status_code == 200, answer.text[-2000:]
        assert [(r["started_at"], r["ended_at"]) for r in answer.json()["runs"]][6] == (0.0, LATEST_TIME_S)
        finished = await api.post(f"/jobs/{job['id']}/finish", json={"state": "done"})
        assert finished.status_code == 200, finished.text[-2000:]
        page = await api.get(f"http://127.0.0.1/jobs/{job['id']}")
        assert page.status_code == 200, page.text[-2000:]
        evidence = await api.get(f"/jobs/{job['id']}/evidence")
        assert evidence.status_code == 200, evidence.text[-2000:]
