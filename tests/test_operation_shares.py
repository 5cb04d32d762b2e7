"""What a lease's operations may take (docs/architecture.md, "Shares of one lab"): a burst of
status-only operations (power status, settle) is answered by the one of its kind that is
live, other operations start at a burst then a steady rate (429 with Retry-After past it),
operations that ended long ago are pruned by the reaper, and the audit is kept as the admin
configures."""
from __future__ import annotations

import asyncio

import pytest

from conftest import SQLITE_ONLY
from device_loop.coordinator.operation_shares import OPERATION_BURST, OPERATIONS_PER_S
from device_loop.core.protocol import OperationKindReport
from lab_in_process import FakeExporter, device, in_process_lab
from test_steps_rules import COOLDOWN, desired_ops, op_report
from test_web_power import power_switch

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.usefixtures("database")]

# the rules here run the same SQL on either database, which the store's own tests, the
# statement counts and the OpenAPI run check on PostgreSQL: SQLite only (docs/architecture.md, "Testing")
DATABASES = SQLITE_ONLY

DAY_S = 86400.0


def board(*kinds: OperationKindReport) -> dict:
    """Device d0: a console with a cool-down step (a settle runs it), a power switch, and
    ``kinds`` of a plugin's."""
    report = {**device("d0"), "steps": [dict(COOLDOWN)]}
    report["resources"].append(power_switch("d0"))
    report["resources"][0]["operations"] = [k.model_dump() for k in kinds]
    return report


async def operation_rows(rules, lease_id: str) -> list[str]:
    async with rules.store.tx():
        return [r["id"] for r in await rules.store.rows("SELECT id FROM operations WHERE lease_id = :l", l=lease_id)]


async def test_a_burst_of_status_and_settle_is_answered_by_the_live_one(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client("alice")
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([board()])
        lease = (await api.post("/leases", json={"device": "d0"})).json()
        asks = [api.post(f"/leases/{lease['id']}/power", json={"action": "status"}) if n % 2 else
                api.post(f"/leases/{lease['id']}/settle") for n in range(360)]
        answers = await asyncio.gather(*asks)
        assert {a.status_code for a in answers} == {201}, {a.text for a in answers if a.status_code != 201}
        started = {(a.json()["kind"], a.json()["id"]) for a in answers}
        assert sorted(kind for kind, _ in started) == ["power", "settle"], started
        assert sorted(await operation_rows(rules, lease["id"])) == sorted(op for _, op in started)
        audited = [e for e in await rules.devices.audit_sql.audit(1000) if e["lease_id"] == lease["id"]]
        assert len([e for e in audited if e["action"] in ("power", "settle")]) == 2, audited

        # once it ended, the next is a new one
        (status,) = [o for o in await desired_ops(api) if o["kind"] == "power"]
        report = op_report(status, "done", "on")
        await exporter.beat([board()], operations=[report])
        again = (await api.post(f"/leases/{lease['id']}/power", json={"action": "status"})).json()
        assert again["id"] != status["op"] and again["state"] == "queued"
        # an operation that changes something is never coalesced: a cycle waits its turn (one at a time)
        cycle = await api.post(f"/leases/{lease['id']}/power", json={"action": "cycle"})
        assert cycle.status_code == 409 and again["id"] in cycle.json()["message"], cycle.text


async def test_a_lease_starts_operations_at_a_burst_then_a_steady_rate(tmp_path):
    probe = OperationKindReport(kind="probe", description="read a sensor", exclusive=False, destructive=False)
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, bob = client("alice"), client("bob")
        exporter = FakeExporter(api, "host-a")
        other = device("d1")
        other["resources"][0]["operations"] = [probe.model_dump()]
        await exporter.beat([board(probe), other])
        lease = (await api.post("/leases", json={"device": "d0"})).json()
        asked = OPERATION_BURST + 20
        answers = [await api.post(f"/leases/{lease['id']}/operations", json={"kind": "probe"}) for _ in range(asked)]
        assert [a.status_code for a in answers] == [201] * OPERATION_BURST + [429] * 20
        refused = answers[-1]
        assert refused.json()["error"] == "too_many_operations" and refused.headers["Retry-After"] == "1"
        assert f"may start {OPERATIONS_PER_S:g} a second" in refused.json()["message"]
        # another lease (bob's) has its own share
        theirs = (await bob.post("/leases", json={"device": "d1"})).json()
        assert (await bob.post(f"/leases/{theirs['id']}/operations", json={"kind": "probe"})).status_code == 201
        clock.advance(1.0)
        later = [(await api.post(f"/leases/{lease['id']}/operations", json={"kind": "probe"})).status_code
                 for _ in range(int(OPERATIONS_PER_S) + 1)]
        assert later == [201] * int(OPERATIONS_PER_S) + [429]
        assert len(await operation_rows(rules, lease["id"])) == OPERATION_BURST + int(OPERATIONS_PER_S)
        # "not yet" is not what an Idempotency-Key keeps: its repeat, later, starts the operation
        keyed = {"Idempotency-Key": "probe-after-its-429"}
        url = f"/leases/{lease['id']}/operations"
        assert (await api.post(url, json={"kind": "probe"}, headers=keyed)).status_code == 429
        clock.advance(1.0)
        assert (await api.post(url, json={"kind": "probe"}, headers=keyed)).status_code == 201
        # what is refused for another reason spends nothing of the share: d0 offline, then back
        await exporter.beat([other])
        offline = [(await api.post(url, json={"kind": "probe"})).status_code for _ in range(OPERATION_BURST)]
        assert set(offline) == {409}
        await exporter.beat([board(probe), other])
        assert (await api.post(url, json={"kind": "probe"})).status_code == 201


def ended_op(op_id: str, kind: str, ended_at: float, state: str = "done", device_name: str = "d0",
             sha256: str | None = None) -> dict:
    return {"id": op_id, "kind": kind, "device": device_name, "host": "host-a", "lease_id": None, "requester": "alice",
            "identifier": "sim:d0", "plugin": "sim", "exclusive": False, "destructive": False, "args": {},
            "image_sha256": sha256, "image_name": sha256 and "img", "image_size": sha256 and 1, "state": state,
            "phase": state, "progress_done": 0, "progress_total": None, "progress_unit": "", "progress_detail": "",
            "message": "", "seconds": {}, "result": None, "verified": False, "boot_id": None, "interrupted": False,
            "purpose": "recovery", "step": None, "audit_id": None, "created_at": ended_at - 10,
            "started_at": ended_at - 5, "ended_at": ended_at}


async def test_old_operations_are_pruned_but_live_ones_and_a_device_s_latest_flashes_stay(tmp_path):
    async with in_process_lab(tmp_path, operation_retention_s=30 * DAY_S) as (client, rules, clock):
        now = clock()
        old, recent = now - 31 * DAY_S, now - 29 * DAY_S
        rows = [ended_op(f"op-old-{n}", "probe", old + n) for n in range(1500)]  # more than one batch
        rows += [ended_op("op-recent", "probe", recent), {**ended_op("op-live", "probe", old), "state": "running",
                                                         "ended_at": None},
                 ended_op("op-flash-1", "flash", old - 30, sha256="a" * 64),   # an older flash: pruned
                 ended_op("op-flash-done", "flash", old - 20, sha256="b" * 64),  # the latest that completed
                 ended_op("op-flash-failed", "flash", old - 10, "failed", sha256="c" * 64),  # the latest that ended
                 ended_op("op-other-flash", "flash", old, device_name="d9", sha256="d" * 64)]
        async with rules.store.tx():
            for row in rows:
                await rules.operations.operations_sql.insert_operation(row)
            await rules.life.audit("alice", "probe", "d0", None, {"old": True})
        clock.advance(61)  # (the reaper prunes once a minute)
        await rules.reap()
        async with rules.store.tx():
            left = {r["id"] for r in await rules.store.rows("SELECT id FROM operations")}
        assert left == {"op-recent", "op-live", "op-flash-done", "op-flash-failed", "op-other-flash"}, sorted(left)[:9]
        assert [e["action"] for e in await rules.devices.audit_sql.audit()] == ["probe"], "the audit is kept"


async def test_the_audit_is_pruned_as_the_admin_configures(tmp_path):
    async with in_process_lab(tmp_path, audit_retention_s=7 * DAY_S) as (client, rules, clock):
        await rules.life.audit("alice", "old", None, None, {})
        clock.advance(8 * DAY_S)
        await rules.life.audit("alice", "new", None, None, {})
        await rules.reap()
        assert [e["action"] for e in await rules.devices.audit_sql.audit()] == ["new"]


async def test_settles_of_a_device_without_a_cool_down_step_take_their_share_too(tmp_path):
    """Such a settle is done at once (nothing live to answer the next), yet each is a row and an
    audit entry: past the lease's burst, 429 as any operation."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client("alice")
        await FakeExporter(api, "host-a").beat([device("d1")])
        lease = (await api.post("/leases", json={"device": "d1"})).json()
        settled = [(await api.post(f"/leases/{lease['id']}/settle")).status_code for _ in range(OPERATION_BURST + 1)]
        assert settled == [201] * OPERATION_BURST + [429]
