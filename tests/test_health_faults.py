"""The coordinator's half of health that heals (docs/architecture.md, "Health that heals"), on
SQLite and PostgreSQL, with the exporter played by hand: a permanent health failure is a
fault only an admin clears, a fault a person or a step set stays when health recovers, each
step of a quarantine its exporter reports is a line of the ring log, and migration 22 keeps
the faults it finds while taking the new kinds."""
import pytest

from device_loop.coordinator.migrations import MIGRATIONS
from device_loop.coordinator.store import Store
from device_loop.coordinator.store import core as store_core
from device_loop.core.protocol import Quarantine
from lab_in_process import FakeExporter, _database, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]


def reported(health: str = "ok", reason: str = "", kind: str = "transient", quarantine: Quarantine | None = None,
             name: str = "d0") -> dict:
    """Device ``name`` as its exporter reports it, with its one resource's health."""
    report = device(name)
    report["resources"][0].update(health=health, reason=reason, health_kind=kind)
    report["quarantine"] = quarantine.model_dump() if quarantine else None
    return report


async def causes(api, name: str = "d0") -> list[str]:
    return [e["cause"] for e in (await api.get(f"/devices/{name}/log")).json()]


async def test_a_permanent_health_failure_is_a_fault_only_an_admin_clears(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client("alice")
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([reported()])
        await exporter.beat([reported("failed", "AER fatal errors: 3", "permanent")])
        shown = (await api.get("/devices/d0")).json()
        assert (shown["state"], shown["fault_kind"]) == ("faulty", "health-permanent")
        assert shown["fault"] == "health failed for good: uart: AER fatal errors: 3" == shown["reason"]
        assert (await causes(api))[-1] == shown["fault"]
        await exporter.beat([reported()])  # the card reads fine again: a person decides
        shown = (await api.get("/devices/d0")).json()
        assert (shown["state"], shown["fault_kind"]) == ("faulty", "health-permanent")
        refused = await api.post("/leases", json={"device": "d0"})
        assert refused.status_code == 409
        cleared = (await api.post("/admin/devices/d0/clear-fault")).json()
        assert (cleared["state"], cleared["fault"], cleared["fault_kind"]) == ("idle", None, None)


async def test_a_transient_failure_is_no_fault(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client("alice")
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([reported("failed", "link down")])
        shown = (await api.get("/devices/d0")).json()
        assert (shown["state"], shown["fault"]) == ("faulty", None)
        await exporter.beat([reported()])
        assert (await api.get("/devices/d0")).json()["state"] == "idle"


async def test_a_person_s_fault_stays_when_health_fails_and_recovers(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client("alice")
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([reported()])
        marked = await api.post("/admin/devices/d0/fault", json={"reason": "smoke from the regulator"})
        assert marked.status_code == 200, marked.text
        shown = marked.json()
        assert (shown["state"], shown["fault_kind"]) == ("faulty", "marked-faulty")
        assert shown["fault"] == "marked faulty by admin alice: smoke from the regulator"
        for health in ("failed", "ok"):
            await exporter.beat([reported(health, "" if health == "ok" else "link down")])
            assert (await api.get("/devices/d0")).json()["state"] == "faulty", "its health clears no person's fault"
        again = await api.post("/admin/devices/d0/fault", json={"reason": "twice"})
        assert again.status_code == 409 and again.json()["error"] == "has_fault"
        audit = [a for a in await rules.devices.audit_sql.audit() if a["action"] == "mark_faulty"]
        assert [a["detail"] for a in audit] == [{"reason": "smoke from the regulator"}]
        cleared = (await api.post("/admin/devices/d0/clear-fault")).json()
        assert cleared["state"] == "idle"


@pytest.mark.parametrize("body, status", [({}, 422), ({"reason": ""}, 422), ({"reason": "x" * 301}, 422),
                                          ({"reason": 7}, 422), ({"reason": "ok", "more": 1}, 422)])
async def test_a_hostile_mark_is_refused(tmp_path, body, status):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client("alice")
        await FakeExporter(api, "host-a").beat([reported()])
        refused = await api.post("/admin/devices/d0/fault", json=body)
        assert refused.status_code == status, refused.text
        missing = await api.post("/admin/devices/nowhere/fault", json={"reason": "gone"})
        assert missing.status_code == 404


def quarantine(probes: int = 0, good: int = 0, probe_s: float = 10.0) -> Quarantine:
    return Quarantine(failures=3, window_s=1800, probe_s=probe_s, probes=probes, good=good, needed=3,
                      reason="link down")


async def test_every_step_of_a_quarantine_is_a_line_of_the_ring_log(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client("alice")
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([reported()])
        await exporter.beat([reported("failed", "link down", quarantine=quarantine())])
        shown = (await api.get("/devices/d0")).json()
        assert shown["state"] == "faulty" and shown["quarantine"]["failures"] == 3
        assert shown["reason"] == "quarantined: failed 3 times in 30 min; next probe in 10 s (link down)"
        assert (await causes(api))[-1] == "quarantine: failed 3 times in 30 min; next probe in 10 s"
        await exporter.beat([reported("failed", "link down", quarantine=quarantine(1, 0, 20))])
        assert (await causes(api))[-1] == "quarantine: probe failed (link down); next probe in 20 s"
        for good in (1, 2):
            await exporter.beat([reported("failed", "link down", quarantine=quarantine(1 + good, good, 20))])
            assert (await causes(api))[-1] == f"quarantine: probe {good} of 3 good"
            assert (await api.get("/devices/d0")).json()["state"] == "faulty"
        await exporter.beat([reported()])
        shown = (await api.get("/devices/d0")).json()
        assert (shown["state"], shown["quarantine"], shown["fault"]) == ("idle", None, None), "no admin needed"
        log = (await api.get("/devices/d0/log")).json()
        assert (log[-1]["from"], log[-1]["to"], log[-1]["cause"]) == ("faulty", "idle",
                                                                      "re-admitted after 3 good probes")


async def test_a_quarantine_that_ends_in_a_permanent_failure_is_not_called_a_readmission(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client("alice")
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([reported("failed", "link down", quarantine=quarantine(2, 2))])  # its last good probe due
        await exporter.beat([reported("failed", "AER fatal errors: 3", "permanent")])
        shown = (await api.get("/devices/d0")).json()
        assert (shown["state"], shown["fault_kind"], shown["quarantine"]) == ("faulty", "health-permanent", None)
        said = await causes(api)
        assert said[-1] == "quarantine ended: its health failed for good (a person clears the fault)"
        assert not any("re-admitted" in cause for cause in said)


async def test_a_quarantine_while_leased_is_noted_and_faulty_once_the_lease_ends(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client("alice")
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([reported()])
        lease = (await api.post("/leases", json={"device": "d0"})).json()
        await exporter.serve(lease)
        await exporter.beat([reported("failed", "link down", quarantine=quarantine())], services=[])
        shown = (await api.get("/devices/d0")).json()
        assert shown["quarantine"] is not None
        assert "quarantine: failed 3 times in 30 min; next probe in 10 s" in await causes(api)


async def test_an_unchanged_quarantine_costs_nothing_more(tmp_path):
    """The same report again (the same probe) writes no line: only a change of the report does."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client("alice")
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([reported("failed", "link down", quarantine=quarantine())])
        before = await causes(api)
        await exporter.beat([reported("failed", "link down", quarantine=quarantine())])
        assert await causes(api) == before


async def test_the_device_page_shows_a_quarantine(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client("alice")
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([reported("failed", "link down", quarantine=quarantine(2, 1))])
        page = (await api.get("http://127.0.0.1/devices/d0")).text
        assert "Quarantined: its health turned failed 3 times within 30 min (last: link down)." in page
        assert "1 of 3 good probes in a row; next probe in 10 s. It is re-admitted by itself" in page


async def test_migration_22_keeps_the_faults_and_takes_the_new_kinds(tmp_path):
    async with _database(tmp_path) as url:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(store_core, "MIGRATIONS", MIGRATIONS[:21])
            old = Store(url)
            await old.connect()
            await old.run("INSERT INTO devices (name, class, tags, state, present, health, health_reason, busy_by, "
                          "retired, created_at, updated_at, fault, fault_kind) VALUES ('b0', 'c', '[]', 'faulty', "
                          "TRUE, 'ok', '', '[]', FALSE, 0, 0, 'step 1/1 reboot failed', 'step-failed')")
            with pytest.raises(Exception):
                await old.run("UPDATE devices SET fault_kind = 'marked-faulty'")  # (not yet a kind)
            await old.disconnect()
        new = Store(url)
        await new.connect()
        try:
            row = await new.row("SELECT fault, fault_kind, quarantine FROM devices WHERE name = 'b0'")
            assert (row["fault"], row["fault_kind"], row["quarantine"]) == ("step 1/1 reboot failed", "step-failed",
                                                                            None)
            for kind in ("health-permanent", "marked-faulty", "switched-off"):
                await new.run("UPDATE devices SET fault_kind = :k", k=kind)
            with pytest.raises(Exception):
                await new.run("UPDATE devices SET fault_kind = 'bogus'")
        finally:
            await new.disconnect()


def test_device_loop_log_says_a_line_that_changed_no_state_by_its_state_alone():
    from device_loop.cli.commands import change_words
    probe = {"at": None, "from": "faulty", "to": "faulty", "cause": "quarantine: probe 1 of 3 good", "actor": "x"}
    assert change_words(probe) == "faulty"
    assert change_words({**probe, "to": "idle"}) == "faulty -> idle"
