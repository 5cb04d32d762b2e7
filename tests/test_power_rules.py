"""The coordinator's power rules (docs/architecture.md, "Power"), against an exporter that
speaks the heartbeat protocol (its reports are the coordinator's hostile input): a device a
person switched off is not handed on dead, whatever its health says, and a failed step's
fault outlives a person's off and on; the automatic power cycle comes once, never after a
person's off; junk results and junk auto_recover values are refused or shown as data."""
import pytest

from lab_in_process import FakeExporter, in_process_lab
from test_web_power import desired_power, reported, switched

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]


def with_health(name: str, health: str, auto_recover: str | None = None) -> dict:
    report = switched(name)
    report["resources"][0]["health"] = health
    report["resources"][0]["reason"] = "" if health == "ok" else "console hung"
    if auto_recover:
        report["auto_recover"] = auto_recover
    return report


async def switch(api, exporter, lease_id: str, action: str, state="done", phase="switching", result=None,
                 health="ok") -> dict:
    asked = await api.post(f"/leases/{lease_id}/power", json={"action": action})
    assert asked.status_code == 201, asked.text
    [op] = [o for o in await desired_power(api) if o["op"] == asked.json()["id"]]
    report = reported(op, state, "switched" if state == "done" else "the switch failed", result)
    report["phase"] = phase
    await exporter.beat([with_health("b0", health)], operations=[report])
    return op


async def test_switched_off_and_given_back_is_faulty_until_switched_on_whatever_its_health_says(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, exporter = client(), None
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([with_health("b0", "ok")])
        lease = (await api.post("/leases", json={"device": "b0"})).json()
        await switch(api, exporter, lease["id"], "off", result={"verdict": "verified"}, health="degraded")
        assert (await api.get("/devices/b0")).json()["state"] != "faulty", "its holder keeps using it"
        await api.post(f"/leases/{lease['id']}/release")
        await exporter.beat([with_health("b0", "degraded")])
        await exporter.beat([with_health("b0", "ok")])  # its health ok again: still off, for all we know
        shown = (await api.get("/devices/b0")).json()
        assert shown["state"] == "faulty" and "switched off by alice" in shown["reason"], shown
        assert (await api.post("/leases", json={"device": "b0"})).status_code == 409
        again = (await api.post("/admin/devices/b0/power", json={"action": "on"})).json()
        [op] = [o for o in await desired_power(api) if o["op"] == again["id"]]
        await exporter.beat([with_health("b0", "ok")], operations=[reported(op, "done", "on",
                                                                          {"verdict": "verified"})])
        assert (await api.get("/devices/b0")).json()["state"] == "idle"


async def test_only_a_verified_on_clears_a_switched_off_fault_not_an_admin(tmp_path):
    """An admin's clear-fault put a board still off back to idle, and it was leased dead."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([with_health("b0", "ok")])
        lease = (await api.post("/leases", json={"device": "b0"})).json()
        await switch(api, exporter, lease["id"], "off", result={"verdict": "verified"})
        await api.post(f"/leases/{lease['id']}/release")
        await exporter.beat([with_health("b0", "ok")])
        refused = await api.post("/admin/devices/b0/clear-fault")
        assert refused.status_code == 409 and refused.json()["error"] == "switched_off", refused.text
        assert "device-loop power on b0" in refused.json()["message"]
        assert (await api.get("/devices/b0")).json()["state"] == "faulty"
        taken = await api.post("/leases", json={"device": "b0"})
        assert taken.status_code == 409 and "switched off by alice" in taken.json()["message"]
        assert "clear-fault" not in taken.json()["message"], "an admin cannot clear that one"

        async def power_on(verdict: str):
            asked = (await api.post("/admin/devices/b0/power", json={"action": "on"})).json()
            [op] = [o for o in await desired_power(api) if o["op"] == asked["id"]]
            report = reported(op, "done", f"{verdict} (nothing showed the change)", {"verdict": verdict})
            await exporter.beat([with_health("b0", "ok")], operations=[report])

        await power_on("unverified")  # (a switch without read-back, a console that said nothing)
        shown = (await api.get("/devices/b0")).json()
        assert shown["state"] == "faulty" and shown["fault"].startswith("switched on, unverified"), shown
        await exporter.beat([with_health("b0", "degraded")])
        await exporter.beat([with_health("b0", "ok")])
        assert (await api.get("/devices/b0")).json()["state"] == "faulty", "health ok says nothing of the power"
        await power_on("verified")
        assert (await api.get("/devices/b0")).json()["state"] == "idle"

        lease = (await api.post("/leases", json={"device": "b0"})).json()
        await switch(api, exporter, lease["id"], "off", result={"verdict": "verified"})
        await switch(api, exporter, lease["id"], "on", result={"verdict": "unverified"})
        await api.post(f"/leases/{lease['id']}/release")
        await exporter.beat([with_health("b0", "ok")])
        assert (await api.get("/devices/b0")).json()["state"] == "faulty"
        cleared = await api.post("/admin/devices/b0/clear-fault")  # an admin who saw it run
        assert cleared.status_code == 200 and cleared.json()["state"] == "idle", cleared.text


async def test_a_step_s_fault_outlives_an_off_and_on_and_a_cycle_that_failed_part_way_leaves_one(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([with_health("b0", "ok")])
        await rules.power.devices_sql.update_device("b0", fault="step 1/1 reflash failed: bad image", fault_kind="step-failed")
        lease = None
        for action in ("off", "on"):
            asked = await api.post("/admin/devices/b0/power", json={"action": action})
            [op] = [o for o in await desired_power(api) if o["op"] == asked.json()["id"]]
            await exporter.beat([with_health("b0", "ok")], operations=[reported(op, "done", "", {"verdict": "x"})])
        assert (await api.get("/devices/b0")).json()["fault"] == "step 1/1 reflash failed: bad image"
        await rules.power.devices_sql.update_device("b0", fault=None, fault_kind=None)
        await exporter.beat([with_health("b0", "degraded")])
        await exporter.beat([with_health("b0", "ok")])
        lease = (await api.post("/leases", json={"device": "b0"})).json()
        await switch(api, exporter, lease["id"], "cycle", state="failed", phase="on")
        assert "switched off, perhaps" in (await api.get("/devices/b0")).json()["fault"]
        await switch(api, exporter, lease["id"], "status", result={"verdict": "verified", "state": "off"})
        soon = await switch(api, exporter, lease["id"], "cycle", result={"verdict": "verified", "first_byte_s": "soon"})
        assert (await api.get("/devices/b0")).json()["fault"] is None
        log = [e["cause"] for e in (await api.get("/devices/b0/log")).json()]
        [line] = [c for c in log if soon["op"] in c and c.startswith("power cycle")]
        assert line.endswith(": verified") and "first console byte" not in line, line  # "soon" is no number


async def test_the_rules_read_a_fault_s_kind_never_its_words(tmp_path):
    """(docs/architecture.md, "Lifecycle"): a step's failure whose words begin like a power off's
    is a step's fault (an admin clears it); a power off's fault in
    other words still holds the board off."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([with_health("b0", "ok")])
        await rules.power.devices_sql.update_device("b0", fault="switched off by the relay plugin: it said so",
                                                    fault_kind="step-failed")
        await exporter.beat([with_health("b0", "degraded")])
        shown = (await api.get("/devices/b0")).json()
        assert (shown["state"], shown["switched_off"]) == ("faulty", None)
        cleared = await api.post("/admin/devices/b0/clear-fault")
        assert cleared.status_code == 200 and cleared.json()["state"] == "idle", cleared.text
        await rules.power.devices_sql.update_device("b0", fault="held: ask ann", fault_kind="switched-off")
        await exporter.beat([with_health("b0", "degraded")])
        await exporter.beat([with_health("b0", "ok")])
        shown = (await api.get("/devices/b0")).json()
        assert (shown["state"], shown["switched_off"]) == ("faulty", "held: ask ann"), "its health clears no off"
        refused = await api.post("/admin/devices/b0/clear-fault")
        assert refused.status_code == 409 and refused.json()["error"] == "switched_off"


async def test_auto_recover_comes_once_an_hour_and_never_after_a_person_s_off(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([with_health("b0", "ok", "power-cycle")])
        await exporter.beat([with_health("b0", "failed", "power-cycle")])
        [auto] = await desired_power(api)
        assert auto["requester"] == "coordinator" and auto["args"] == {"action": "cycle"}
        await exporter.beat([with_health("b0", "failed", "power-cycle")],
                            operations=[reported(auto, "done", "", {"verdict": "verified"})])
        await exporter.beat([with_health("b0", "ok", "power-cycle")])
        await exporter.beat([with_health("b0", "failed", "power-cycle")])  # failed again at once
        assert not await desired_power(api), "not twice in an hour"
        assert any("power-cycled 0 min ago" in e["cause"] for e in (await api.get("/devices/b0/log")).json())
        await exporter.beat([with_health("b0", "ok", "power-cycle")])
        clock.advance(3601)
        lease = (await api.post("/leases", json={"device": "b0"})).json()
        await switch(api, exporter, lease["id"], "off", result={"verdict": "verified"})
        await api.post(f"/leases/{lease['id']}/release")
        await exporter.beat([with_health("b0", "failed", "power-cycle")])
        assert not await desired_power(api), "a person's off is not undone"
        refused = await exporter.beat([with_health("b0", "failed", "reboot-everything")])
        assert refused.status_code == 422
