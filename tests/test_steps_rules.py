"""Steps between leases, the coordinator's half (docs/architecture.md, "Steps between
leases"): the sequence of operations a device's reported steps become after each lease, the
device reclaiming meanwhile, faulty when one fails, again from the first after an
interrupted one, and settle inside a lease. The exporter is played by hand here;
tests/test_steps_end_to_end.py runs the real one."""
import contextlib

import pytest

from conftest import SQLITE_ONLY
from lab_in_process import FakeExporter, device, flash_target, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]

# the rules here run the same SQL on either database, which the store's own tests, the
# statement counts and the OpenAPI run check on PostgreSQL: SQLite only (docs/architecture.md, "Testing")
DATABASES = SQLITE_ONLY

COOLDOWN = {"step": "cooldown", "plugin": "exporter", "identifier": "sim:d0", "timeout_s": 600.0, "settle": True}
REBOOT = {"step": "reboot", "plugin": "exporter", "identifier": "sim:d0", "timeout_s": 300.0, "settle": False}
REFLASH = {"step": "reflash", "plugin": "flash", "identifier": "flash:host-a:d0", "timeout_s": 1800.0,
           "settle": False}


def stepped(*steps, flash=False) -> dict:
    report = {**device("d0"), "steps": [dict(s) for s in steps]}
    if flash:
        report["resources"].append(flash_target("d0"))
    return report


def op_report(op: dict, state: str, message: str = "", detail: str = "", phase: str = "running",
              interrupted: bool = False) -> dict:
    return {"op": op["op"], "device": op["device"], "kind": op["kind"], "state": state, "phase": phase,
            "progress": {"done": 0, "total": None, "unit": "", "detail": detail}, "message": message,
            "seconds": {}, "result": None, "changed": True, "interrupted": interrupted}


async def desired_ops(api) -> list[dict]:
    return (await api.get("/hosts/host-a/desired")).json()["operations"]


async def used_and_released(api, exporter, report) -> dict:
    lease = (await api.post("/leases", json={"device": "d0"})).json()
    await exporter.serve(lease)  # (serve reports a plain device: give it its steps again below)
    await exporter.beat([report], applied=[lease["id"]])
    await api.post(f"/leases/{lease['id']}/release")
    assert (await api.get("/devices/d0")).json()["state"] == "reclaiming"
    await exporter.beat([report])  # its services are gone: the steps begin
    return lease


@contextlib.asynccontextmanager
async def reclaiming_under_its_first_step(tmp_path):
    """A lab whose device d0 (steps: cooldown, reboot) was used and released by alice: it is
    reclaiming, and its first step is the host's desired operation."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client("alice")
        exporter = FakeExporter(api, "host-a")
        report = stepped(COOLDOWN, REBOOT)
        await exporter.beat([report])
        await used_and_released(api, exporter, report)
        (first,) = await desired_ops(api)
        yield api, rules, clock, exporter, report, first


async def test_steps_run_in_order_as_operations_while_the_device_is_reclaimed(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, bob = client("alice"), client("bob")
        exporter = FakeExporter(api, "host-a")
        report = stepped(COOLDOWN, REBOOT)
        await exporter.beat([report])
        assert (await api.get("/devices/d0")).json()["steps"] == ["cooldown", "reboot"]
        await used_and_released(api, exporter, report)
        ticket = (await bob.post("/leases", json={"device": "d0", "queue": True})).json()
        assert ticket["state"] == "waiting", "reclaiming until its steps are done"
        (first,) = await desired_ops(api)
        assert (first["kind"], first["plugin"], first["args"], first["requester"], first["purpose"], first["step"]) == (
            "cooldown", "exporter", {}, "coordinator", "step", 0)
        shown = (await api.get("/devices/d0")).json()
        assert shown["state"] == "reclaiming" and shown["reason"] == "step 1/2 cooldown: queued"
        await exporter.beat([report], operations=[op_report(first, "running",
                                                            detail="cooling down: 51.2 °C, waiting for < 45 °C")])
        shown = (await api.get("/devices/d0")).json()
        assert shown["reason"] == "step 1/2 cooldown: cooling down: 51.2 °C, waiting for < 45 °C"
        assert shown["step"]["detail"].startswith("cooling down")
        await exporter.beat([report], operations=[op_report(first, "done", "44.9 °C after 31 s")])
        (second,) = await desired_ops(api)
        assert (second["kind"], second["args"], second["step"]) == ("reboot", {}, 1)
        assert (await api.get("/devices/d0")).json()["state"] == "reclaiming"
        await exporter.beat([report], operations=[op_report(second, "done", "prompt seen after 2.1 s")])
        granted = (await bob.post(f"/tickets/{ticket['ticket']}/claim")).json()
        assert granted["state"] == "claimed" and granted["lease"]["device"] == "d0", \
            "granted in the report that ended the last step"
        causes = [e["cause"] for e in (await api.get("/devices/d0/log")).json()]
        assert any(c.startswith("step 1/2 cooldown done: 44.9 °C") for c in causes)
        assert any(c.startswith("step 2/2 reboot done: prompt seen") for c in causes)
        kinds = [o["kind"] for o in (await api.get("/devices/d0/operations")).json()]
        assert kinds == ["reboot", "cooldown"], "listed with the device's operations"
        audit = [a for a in await rules.devices.audit_sql.audit() if a["action"] == "step"]
        assert [a["detail"]["step"] for a in audit] == [1, 0] and "ended" in audit[-1]["detail"]["cause"]


async def test_a_failing_step_leaves_the_device_faulty_until_an_admin_clears_it(tmp_path):
    async with reclaiming_under_its_first_step(tmp_path) as (api, rules, clock, exporter, report, first):
        await exporter.beat([report], operations=[op_report(first, "failed", "still 52.0 °C after 10m (threshold "
                                                                             "45 °C)")])
        shown = (await api.get("/devices/d0")).json()
        assert shown["state"] == "faulty" and shown["fault"].startswith("step 1/2 cooldown failed: still 52.0 °C")
        assert shown["reason"] == shown["fault"] and await desired_ops(api) == [], "the later steps do not run"
        refused = await api.post("/leases", json={"device": "d0"})
        assert refused.status_code == 409 and "still 52.0" in refused.json()["message"]
        await exporter.beat([report])
        assert (await api.get("/devices/d0")).json()["state"] == "faulty", "its health being ok clears nothing"
        cleared = (await api.post("/admin/devices/d0/clear-fault")).json()
        assert cleared["state"] == "idle" and cleared["fault"] is None
        again = await api.post("/admin/devices/d0/clear-fault")
        assert again.status_code == 409


async def test_health_recovering_clears_no_step_fault(tmp_path):
    """(docs/architecture.md, "Health that heals"): a fault a step set stays when the device's
    health fails and recovers; an admin clears it."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client("alice")
        exporter = FakeExporter(api, "host-a")
        report = stepped(REBOOT)
        await exporter.beat([report])
        await used_and_released(api, exporter, report)
        (first,) = await desired_ops(api)
        await exporter.beat([report], operations=[op_report(first, "failed", "no prompt within 5m")])
        sick = {**report, "resources": [{**report["resources"][0], "health": "failed", "reason": "no console"}]}
        await exporter.beat([sick])
        assert (await api.get("/devices/d0")).json()["state"] == "faulty"
        await exporter.beat([report])
        shown = (await api.get("/devices/d0")).json()
        assert (shown["state"], shown["fault"], shown["fault_kind"]) == ("faulty", "step 1/1 reboot failed: no prompt "
                                                                                   "within 5m", "step-failed")
        cleared = (await api.post("/admin/devices/d0/clear-fault")).json()
        assert (cleared["state"], cleared["fault"]) == ("idle", None)


async def test_an_interrupted_step_makes_the_steps_run_again_from_the_first(tmp_path):
    async with reclaiming_under_its_first_step(tmp_path) as (api, rules, clock, exporter, report, first):
        await exporter.beat([report], operations=[op_report(first, "done", "cool")])
        (second,) = await desired_ops(api)
        await exporter.beat([report], operations=[op_report(second, "running")])
        exporter.reboot()  # killed during the reboot step: its next start reports it interrupted
        await exporter.beat([report])
        (again,) = await desired_ops(api)
        assert (again["kind"], again["step"]) == ("cooldown", 0), "from the first step again"
        assert (await api.get("/devices/d0")).json()["state"] == "reclaiming"
        causes = [e["cause"] for e in (await api.get("/devices/d0/log")).json()]
        assert any("interrupted" in c and "again from the first" in c for c in causes)


async def test_a_step_is_interrupted_by_its_report_s_flag_never_by_its_words(tmp_path):
    """(docs/architecture.md, "Operations"): a plugin whose error begins "interrupted" failed its
    step (the device is faulty); an exporter that stopped under a step says so in its report,
    and the steps run again from the first."""
    async with reclaiming_under_its_first_step(tmp_path) as (api, rules, clock, exporter, report, first):
        await exporter.beat([report], operations=[op_report(first, "failed", "interrupted while cooling down: the "
                                                                             "exporter stopped", interrupted=True)])
        (again,) = await desired_ops(api)
        assert (again["kind"], again["step"]) == ("cooldown", 0), "from the first step again"
        await exporter.beat([report], operations=[op_report(again, "failed", "interrupted by the relay: it said so")])
        shown = (await api.get("/devices/d0")).json()
        assert shown["state"] == "faulty" and await desired_ops(api) == [], "a plugin's words interrupt nothing"
        assert shown["fault"] == "step 1/2 cooldown failed: interrupted by the relay: it said so"


async def test_reflash_writes_the_latest_known_good_image_through_the_flash_path(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client("alice")
        exporter = FakeExporter(api, "host-a")
        report = stepped(REFLASH, flash=True)
        await exporter.beat([report])
        await used_and_released(api, exporter, report)
        shown = (await api.get("/devices/d0")).json()
        assert shown["state"] == "faulty" and "no image is known-good" in shown["fault"], \
            "nothing to reflash: a clear fault, not a hang"
        await api.post("/admin/devices/d0/clear-fault")
        uploaded = await api.post("/images", params={"name": "fw-1", "for": "class:sim-board"}, content=b"x" * 4096)
        assert uploaded.status_code == 201, uploaded.text
        await api.post("/admin/images/fw-1/known-good", json={"for": "class:sim-board"})
        await used_and_released(api, exporter, report)
        (op,) = await desired_ops(api)
        assert (op["kind"], op["plugin"], op["image"]["name"], op["requester"]) == ("flash", "flash", "fw-1",
                                                                                   "coordinator")
        audit = await rules.devices.audit_sql.audit()
        assert audit[0]["action"] == "reflash" and audit[0]["detail"]["cause"].startswith("lease ")
        await exporter.beat([report], operations=[op_report(op, "done", "written and verified", phase="writing")])
        assert (await api.get("/devices/d0")).json()["state"] == "idle"


async def test_settle_runs_the_cooldown_steps_inside_a_lease_and_is_done_at_once_without_any(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, bob = client("alice"), client("bob")
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([stepped()])
        lease = (await api.post("/leases", json={"device": "d0"})).json()
        nothing = (await api.post(f"/leases/{lease['id']}/settle")).json()
        assert nothing["state"] == "done" and "nothing to settle" in nothing["message"]
        assert (await bob.post(f"/leases/{lease['id']}/settle")).status_code in (403, 404), "only its holder"
        await api.post(f"/leases/{lease['id']}/release")
        await exporter.beat([stepped(COOLDOWN, REBOOT)])
        (cool,) = await desired_ops(api)
        await exporter.beat([stepped(COOLDOWN, REBOOT)], operations=[op_report(cool, "done", "cool")])
        (boot,) = await desired_ops(api)
        await exporter.beat([stepped(COOLDOWN, REBOOT)], operations=[op_report(boot, "done", "up")])
        lease = (await api.post("/leases", json={"device": "d0"})).json()
        settling = (await api.post(f"/leases/{lease['id']}/settle")).json()
        assert (settling["kind"], settling["state"]) == ("settle", "queued")
        (op,) = await desired_ops(api)
        assert (op["kind"], op["plugin"], op["args"]) == ("settle", "exporter", {})
        await exporter.beat([stepped(COOLDOWN, REBOOT)], operations=[op_report(op, "done", "44 °C: settled")])
        ended = (await api.get(f"/ops/{op['op']}")).json()
        assert ended["state"] == "done" and (await api.get(f"/leases/{lease['id']}")).json()["state"] != "released"
