"""Jobs as the database keeps them (migration 17): concurrent claims never take one job twice,
the reaper's pass is bounded, a database of the previous version is upgraded with its
devices' facts empty, and the facts a heartbeat reports are stored and shown. On SQLite, and
on PostgreSQL where the suite has one."""
import asyncio

import pytest

from device_loop.coordinator.jobs import SILENT_PER_PASS
from device_loop.coordinator.migrations import MIGRATIONS
from device_loop.coordinator.store import Store
from device_loop.coordinator.store.devices import DeviceQueries
from device_loop.coordinator.store.jobs import JobQueries
from device_loop.coordinator.store.leases import LeaseQueries
from device_loop.coordinator.store.tickets import TicketQueries
from device_loop.core.ab.jobs import JobSpec
from device_loop.coordinator.who import Who
from device_loop.core.vocabulary import TicketKind
from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]

SPEC = JobSpec.model_validate({"target": {"class": "sim-board"}, "run": ["true"]})


async def test_concurrent_claims_take_each_job_once(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        jobs = rules.jobs
        made = [(await jobs.submit(SPEC, False, None, Who("ann"), TicketKind.INTERACTIVE))["id"] for _ in range(5)]
        claims = await asyncio.gather(*(jobs.claim(["ann"], f"w{n}", Who("root", admin=True)) for n in range(10)))
        taken = [c["job"]["id"] for c in claims if c["job"] is not None]
        assert sorted(taken) == sorted(made), "each queued job claimed exactly once"
        workers = await rules.store.read("SELECT worker FROM jobs WHERE state = 'running'")
        assert len({w["worker"] for w in workers}) == 5


async def test_the_reaper_ends_a_bounded_number_of_silent_jobs_a_pass(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        for _ in range(SILENT_PER_PASS + 3):
            await rules.jobs.submit(SPEC, True, None, Who("ann"), TicketKind.INTERACTIVE)
        clock.advance(rules.settings.job_worker_timeout_s + 1)
        await rules.reap()
        states = await rules.jobs.jobs_sql.job_counts()
        assert states == {"failed": SILENT_PER_PASS, "running": 3}
        await rules.reap()
        assert await rules.jobs.jobs_sql.job_counts() == {"failed": SILENT_PER_PASS + 3}


async def test_a_database_of_the_previous_version_is_upgraded(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        await FakeExporter(client(), "host-a").beat([device("b0")])
        before = (await client().post("/leases", json={"device": "b0", "ttl_s": 600})).json()
        url = rules.store.url
        store = rules.store  # back to version 16: migration 17's tables and columns gone, and 18's to 24's
        for table in ("jobs", "job_cells", "job_runs", "job_leases"):
            await store.run(f"DROP TABLE {table}")
        for column in ("facts", "auto_recovery", "auto_recovered_at", "fault_kind", "fidelity", "quarantine",
                       "lab_failures"):
            await store.run(f"ALTER TABLE devices DROP COLUMN {column}")
        await store.run("DROP INDEX tickets_lapse")
        for table, column in (("leases", "keepalive_s"), ("leases", "ends_at"), ("tickets", "keepalive_s"),
                              ("tickets", "lapses_at"), ("operations", "verified")):
            await store.run(f"ALTER TABLE {table} DROP COLUMN {column}")
        for column in ("interrupted", "purpose", "step"):
            await store.run(f"ALTER TABLE operations DROP COLUMN {column}")
        await store.run("ALTER TABLE user_counts DROP COLUMN open_jobs")
        for column in ("needs", "fallback", "fallback_at"):
            await store.run(f"ALTER TABLE tickets DROP COLUMN {column}")
        await store.run("INSERT INTO tickets (id, requester, kind, device, device_class, tags, ttl_s, state, created_at) "
                        "VALUES ('tk-old', 'ann', 'interactive', NULL, 'sim-board', '[]', 60, 'waiting', 0)")
        await store.run("UPDATE devices SET fault = 'switched off by ann at noon (op-1)' WHERE name = 'b0'")
        for op, kind, plugin, lease, requester, args in (
                ("op-step", "cooldown", "exporter", None, "coordinator", '{"step": 1}'),
                ("op-settle", "settle", "exporter", "lease-1", "ann", "{}"),
                ("op-cycle", "power", "power", None, "coordinator", '{"action": "cycle"}'),
                ("op-mine", "count", "bench", "lease-1", "ann", '{"step": 3}')):
            await store.run("INSERT INTO operations (id, kind, device, host, lease_id, requester, identifier, plugin, "
                            "exclusive, destructive, args, state, phase, progress_done, progress_unit, "
                            "progress_detail, message, seconds, created_at) VALUES (:id, :kind, 'b0', 'host-a', "
                            ":lease, :requester, 'x', :plugin, TRUE, FALSE, :args, 'done', 'done', 0, '', '', '', "
                            "'{}', 0)", id=op, kind=kind, lease=lease, requester=requester, plugin=plugin, args=args)
        # ... and 25's to 28's (shares of one lab: scopes, bands and turns, budgets, the index on leases' end)
        for table, column in (("tokens", "scope"), ("tokens", "band"), ("tickets", "band"), ("tickets", "turn"),
                              ("leases", "token_id"), ("leases", "held_s"), ("leases", "held_from"),
                              ("leases", "held_period"), ("leases", "budget_capped"), ("leases", "token_counted"),
                              ("tickets", "token_id")):
            await store.run(f"ALTER TABLE {table} DROP COLUMN {column}")
        for table in ("token_usage", "token_counts"):
            await store.run(f"DROP TABLE {table}")
        await store.run("DROP INDEX leases_ended")
        await store.run("ALTER TABLE user_counts DROP COLUMN stored_runs")  # ... and 28's (what is finite, shared)
        for index in ("operations_lease", "operations_ended", "audit_at"):
            await store.run(f"DROP INDEX {index}")
        await store.run("DELETE FROM schema_migrations WHERE version >= 17")
        assert len(MIGRATIONS) == 30, "a newer migration: take it off here too"  # (29's, 30's: on jobs, dropped)
        again = Store(url)  # a coordinator of this version starts on it
        await again.connect()
        try:
            upgraded = await DeviceQueries(again).device("b0")
            assert upgraded["facts"] == {}
            # the words a fault was read by before migration 19, read once more into its kind
            assert (upgraded["fault_kind"], upgraded["fidelity"]) == ("switched-off", "hardware")
            assert await JobQueries(again).job_counts() == {}
            # the step's place that was an argument, read once into the operation's purpose and step (migration 20)
            rows = {r["id"]: (r["purpose"], r["step"])
                    for r in await again.rows("SELECT id, purpose, step FROM operations WHERE id LIKE 'op-%'")}
            assert rows == {"op-step": ("step", 1), "op-settle": ("settle", None), "op-cycle": ("recovery", None),
                            "op-mine": ("lease", None)}
            # a ticket made before needs existed takes any device, as it did (migration 21)
            ticket = await TicketQueries(again).ticket("tk-old")
            assert ticket is not None and (ticket["needs"], ticket["fallback"], ticket["fallback_at"]) == (None,) * 3
            assert (ticket["band"], ticket["turn"]) == ("normal", 0), "a ticket of before is normal, at the first turn"
            # a lease of before has no keepalive, and ends when it expires (migration 24)
            old = await LeaseQueries(again).lease(before["id"])
            assert old is not None and (old["keepalive_s"], old["ends_at"]) == (None, old["expires_at"])
        finally:
            await again.disconnect()


async def test_the_facts_a_heartbeat_reports_are_stored_and_shown(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([{**device("b0"), "facts": {"board.revision": "C", "emulated": "false"}}])
        assert (await api.get("/devices/b0")).json()["facts"] == {"board.revision": "C", "emulated": "false"}
        await exporter.beat([{**device("b0"), "facts": {"board.revision": "D"}}])  # a change of facts alone
        assert (await api.get("/devices/b0")).json()["facts"] == {"board.revision": "D"}
        refused = await exporter.beat([{**device("b0"), "facts": {"Bad Key": "x"}}])
        assert refused.status_code == 422
        too_many = await exporter.beat([{**device("b0"), "facts": {f"k{n}": "v" for n in range(65)}}])
        assert too_many.status_code == 422
        assert (await api.get("/devices/b0")).json()["facts"] == {"board.revision": "D"}
