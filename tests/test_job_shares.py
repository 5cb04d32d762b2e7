"""What a person's jobs may keep and take (docs/architecture.md, "Shares of one lab"): stored runs are
bounded per person (a finished job's count until it is deleted), a job's runs are read in
pages, and its answer holds only the first of them."""
from __future__ import annotations

import pytest

from device_loop.coordinator.identity import issue_token
from device_loop.coordinator.jobs import JOB_RUNS_SHOWN
from device_loop.core.scopes import TokenScope
from device_loop.core.vocabulary import TokenKind
from lab_in_process import in_process_lab
from test_budgets import board, exporter_of, length, token
from test_jobs_api import run, submitted

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]

LONG = {"title": "many", "target": {"class": "sim-board"}, "run": ["true"], "rounds": 200}


async def test_stored_runs_are_bounded_per_person_until_a_job_is_deleted(tmp_path):
    async with in_process_lab(tmp_path, max_stored_runs=3) as (client, rules, clock):
        alice, bob = client("alice"), client("bob")
        job = await submitted(alice, LONG)
        assert [(await alice.post(f"/jobs/{job['id']}/runs", json=run(seq, "run", 1.0))).status_code
                for seq in range(3)] == [201] * 3
        refused = await alice.post(f"/jobs/{job['id']}/runs", json=run(3, "run", 1.0))
        assert refused.status_code == 409 and refused.json()["error"] == "too_many_stored_runs", refused.text
        assert "device-loop job rm" in refused.json()["message"]
        full = await alice.post("/jobs", json={"spec": LONG, "claim": True})
        assert full.status_code == 409 and full.json()["error"] == "too_many_stored_runs"
        theirs = await submitted(bob, LONG)  # another person's share is their own
        assert (await bob.post(f"/jobs/{theirs['id']}/runs", json=run(0, "run", 1.0))).status_code == 201

        still_open = await alice.post(f"/jobs/{job['id']}/delete")
        assert still_open.status_code == 409 and still_open.json()["error"] == "job_open"
        await alice.post(f"/jobs/{job['id']}/finish", json={"state": "done"})
        assert (await bob.post(f"/jobs/{job['id']}/delete")).status_code == 404, "only its owner (or an admin)"
        gone = await alice.post(f"/jobs/{job['id']}/delete")
        assert gone.status_code == 200 and gone.json() == {"deleted": job["id"], "runs": 3}
        assert (await alice.get(f"/jobs/{job['id']}")).status_code == 404
        again = await submitted(alice, LONG)
        assert (await alice.post(f"/jobs/{again['id']}/runs", json=run(0, "run", 1.0))).status_code == 201


async def test_a_job_with_many_runs_is_read_in_pages(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        alice, bob = client("alice"), client("bob")
        job = await submitted(alice, LONG)
        many = JOB_RUNS_SHOWN * 2 + 7
        async with rules.store.tx():
            for seq in range(many):
                await rules.jobs.jobs_sql.insert_job_run({"job": job["id"], **run(seq, "run", 1.0 + seq % 5),
                                                          "attempt": 0, "failure": None, "output_tail": ""})
        shown = (await alice.get(f"/jobs/{job['id']}")).json()
        assert (len(shown["runs"]), shown["run_count"]) == (JOB_RUNS_SHOWN, many)
        assert shown["runs_next"] == f"0.0.{JOB_RUNS_SHOWN - 1}" and shown["analysis"] is not None
        seqs, after = [r["seq"] for r in shown["runs"]], shown["runs_next"]
        while after:
            page = (await alice.get(f"/jobs/{job['id']}/runs", params={"after": after, "limit": 300})).json()
            assert page["run_count"] == many and len(page["runs"]) <= 300
            seqs += [r["seq"] for r in page["runs"]]
            after = page["next"]
        assert seqs == list(range(many))
        assert (await alice.get(f"/jobs/{job['id']}", params={"runs": "false"})).json()["runs_next"] is None
        assert (await bob.get(f"/jobs/{job['id']}/runs")).status_code == 404, "only who may read the job"
        for hostile in ({"after": "x"}, {"after": "1.2"}, {"after": "9999999.0.0"}, {"after": "0.0.-1"},
                        {"limit": 0}, {"limit": 501}, {"limit": "many"}):
            refused = await alice.get(f"/jobs/{job['id']}/runs", params=hostile)
            assert refused.status_code == 400, (hostile, refused.text)


async def test_a_job_s_leases_are_held_to_its_submitting_token_s_scope_and_budget(tmp_path):
    async with in_process_lab(tmp_path, single_user=False, allocating_timeout_s=7 * 86400.0) as (client, rules, clock):
        scope = TokenScope(classes=("rpi4",), budget_s=120)
        bot = client(token=await token(rules, "bot", scope, kind=TokenKind.AGENT))
        await (await exporter_of(client, rules)).beat([board("b0"), board("p0", "rpi4"), board("p1", "rpi4")])
        spec = {"target": {"class": "rpi4"}, "run": ["true"], "lease_ttl_s": 600}
        job = (await bot.post("/jobs", json={"spec": spec, "claim": True})).json()
        outside = await bot.post(f"/jobs/{job['id']}/reserve", json={"cell": 0, "device": "b0"})
        assert outside.status_code == 403 and outside.json()["error"] == "out_of_scope", outside.text
        lease = (await bot.post(f"/jobs/{job['id']}/reserve", json={"cell": 0, "class": "rpi4"})).json()
        assert lease["device"] in ("p0", "p1") and length(lease) == 120, "to its token's budget's end"
        spent = await bot.post(f"/jobs/{job['id']}/reserve", json={"cell": 0, "class": "rpi4"})
        assert spent.status_code == 403 and spent.json()["error"] == "budget_spent", spent.text
        # a job of an unscoped token's is not held to anything
        root = client(token=(await issue_token(rules.store, rules.clock, "root", admin=True))["token"])
        theirs = (await root.post("/jobs", json={"spec": spec, "claim": True})).json()
        free = (await root.post(f"/jobs/{theirs['id']}/reserve", json={"cell": 0, "device": "b0"})).json()
        assert length(free) == 600, free
