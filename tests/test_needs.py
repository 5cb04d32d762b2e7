"""What a request may run on (docs/architecture.md, "Who gets the next lease"): ``needs =
"any"`` lands on virtual and emulated devices and never on a board or a simulated one,
``real-hw`` the reverse; a ticket's fallback to real hardware applies after its wait (the
lab's clock moved by hand, the reaper's one query or the grant where a device becomes free);
a reserve by name whose needs the device does not meet is refused, naming its fidelity;
hostile needs are refused with a clear message. In-process, devices of each fidelity as an
exporter reports them: no virtual machine needed."""
import pytest

from device_loop.core.needs import FIDELITY_DETAIL
from device_loop.core.protocol import EndpointReport, ServiceReport
from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]

SITE = "http://127.0.0.1"


def lab_devices() -> list[dict]:
    """A simulated board, a board on the bench and two emulated VM slots, as their exporter reports them."""
    return [device("sim0", fidelity="simulated", tags=("sim", "avx2")),
            device("hw0", fidelity="hardware", device_class="x86-board", tags=("avx2",)),
            device("vm0", fidelity="emulated", device_class="qemu-x86", tags=("virtual", "x86_64", "avx2"),
                   facts={FIDELITY_DETAIL: "TCG"}),
            device("vm1", fidelity="virtual", device_class="qemu-x86", tags=("virtual", "x86_64"),
                   facts={FIDELITY_DETAIL: "KVM"})]


async def beat(exporter: FakeExporter, leases=()) -> None:
    """A heartbeat of the lab's devices with the services of ``leases`` up (they stay held)."""
    services = [ServiceReport(lease=lease["id"], device=lease["device"], identifier=f"sim:{lease['device']}",
                              kind="uart", endpoints=[EndpointReport(kind="uart", host="127.0.0.1", port=4000 + n)]
                              ).model_dump(exclude_none=True) for n, lease in enumerate(leases)]
    assert (await exporter.beat(lab_devices(), services, [lease["id"] for lease in leases])).status_code == 200


async def started(client, user: str = "alice"):
    api = client(user)
    exporter = FakeExporter(api, "host-a")
    assert (await exporter.beat(lab_devices())).status_code == 200
    return api, exporter


async def reserve(api, **body):
    return await api.post("/leases", json=body)


async def test_needs_any_lands_on_virtual_devices_and_real_hw_on_boards(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, _ = await started(client)
        first = (await reserve(api, needs="any")).json()
        second = (await reserve(api, needs="any")).json()
        assert {first["device"], second["device"]} == {"vm0", "vm1"}, "neither class nor tags: any virtual device"
        refused = await reserve(api, needs="any")
        assert refused.status_code == 409 and refused.json()["error"] == "none_free", refused.text
        assert "needs any" in refused.json()["message"] and "2 allocating" in refused.json()["message"]
        boards = [(await reserve(api, needs="real-hw")).json()["device"] for _ in range(2)]
        assert sorted(boards) == ["hw0", "sim0"], "a simulated board stands in for hardware, and says so"
        assert (await reserve(api, needs="real-hw")).json()["error"] == "none_free"

    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, _ = await started(client)
        tagged = (await reserve(api, needs="any", tags=["avx2"])).json()
        assert tagged["device"] == "vm0", "tags narrow it: the emulated slot with avx2, never sim0 or hw0"
        assert (await reserve(api, needs="any", tags=["avx2"])).json()["error"] == "none_free"
        missing = await reserve(api, needs="any", tags=["sve2"])
        assert missing.status_code == 404 and missing.json()["error"] == "no_such_devices"
        assert "needs any" in missing.json()["message"]
        real = (await reserve(api, needs="real-hw", tags=["avx2"])).json()["device"]
        assert real in ("sim0", "hw0")
        plain = (await reserve(api, tags=["avx2"])).json()["device"]
        assert plain in ("sim0", "hw0") and plain != real, "without needs: any fidelity, as before"


async def test_a_reserve_by_name_the_device_does_not_meet_is_refused_naming_its_fidelity(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, _ = await started(client)
        for name, needs, fidelity in (("sim0", "any", "simulated"), ("hw0", "any", "hardware"),
                                      ("vm0", "real-hw", "emulated"), ("vm1", "real-hw", "virtual")):
            for queue in (False, True):  # a wait cures nothing: never a ticket
                refused = await reserve(api, device=name, needs=needs, queue=queue)
                assert refused.status_code == 409, refused.text
                said = refused.json()
                assert said["error"] == "wrong_fidelity" and f"{name} is {fidelity}" in said["message"], said
        waited = await reserve(api, device="sim0", needs="any", fallback="real-hw", fallback_after_s=30)
        assert waited.status_code == 409 and "after 30s of waiting" in waited.json()["message"]
        at_once = await reserve(api, device="sim0", needs="any", fallback="real-hw", fallback_after_s=0)
        assert at_once.status_code == 201 and at_once.json()["device"] == "sim0", "a fallback that waits nothing"
        assert (await reserve(api, device="vm0", needs="any")).json()["device"] == "vm0"
        assert (await reserve(api, device="hw0", needs="real-hw")).json()["device"] == "hw0"
        assert (await reserve(api, device="vm1")).json()["device"] == "vm1", "no needs: any device by name"


async def test_a_ticket_falls_back_to_real_hardware_only_after_its_wait(tmp_path):
    """The reaper's pass (one query) grants a ticket whose fallback came while a board stood
    idle; nothing does before."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, exporter = await started(client)
        bob = client("bob")
        vms = [(await reserve(bob, needs="any")).json() for _ in range(2)]  # both VMs held all along
        ticket = (await reserve(api, needs="any", fallback="real-hw", fallback_after_s=60, queue=True)).json()
        patient = (await reserve(api, needs="any", queue=True)).json()
        assert ticket["state"] == "waiting" and ticket["needs"] == "any" and ticket["fallback"] == "real-hw"
        assert "needs any, real-hw after 1m" in ticket["wants"] and ticket["fallback_at"]
        clock.advance(59)
        await beat(exporter, vms)  # (the host stays online, bob's leases up)
        await rules.reap()
        assert (await api.get(f"/tickets/{ticket['ticket']}")).json()["state"] == "waiting", "not before its wait"
        clock.advance(2)
        await beat(exporter, vms)
        await rules.reap()
        granted = (await api.post(f"/tickets/{ticket['ticket']}/claim")).json()
        assert granted["state"] == "claimed" and granted["lease"]["device"] in ("hw0", "sim0"), granted
        clock.advance(1800)
        await beat(exporter, vms + [granted["lease"]])
        await rules.reap()
        still = (await api.get(f"/tickets/{patient['ticket']}")).json()
        assert still["state"] == "waiting", "needs any without a fallback never takes a board, however long"
        queue = (await api.get("/queue")).json()
        assert [(e["needs"], e["fallback"]) for e in queue] == [("any", None)]


async def test_an_aged_ticket_is_granted_where_a_board_becomes_free(tmp_path):
    """In the transaction that frees a device, as every grant: the board goes to the ticket
    whose fallback came, never to one that waits for a virtual device only."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, exporter = await started(client)
        bob = client("bob")
        held = {}
        for needs in ("any", "any", "real-hw", "real-hw"):  # everything held
            lease = (await reserve(bob, needs=needs)).json()
            held[lease["device"]] = lease
        only_vm = (await reserve(api, needs="any", queue=True)).json()
        falls_back = (await reserve(api, needs="any", fallback="real-hw", queue=True)).json()
        assert falls_back["fallback_at"] and "real-hw after 1m" in falls_back["wants"]
        await bob.post(f"/leases/{held['hw0']['id']}/release")
        await exporter.beat(lab_devices())  # hw0 reclaimed and idle: nobody's ticket takes it yet
        assert (await api.get(f"/tickets/{falls_back['ticket']}")).json()["state"] == "waiting"
        assert {d["name"]: d["state"] for d in (await api.get("/devices")).json()}["hw0"] == "idle"
        lease = (await reserve(bob, device="hw0")).json()  # bob takes it back meanwhile
        clock.advance(61)
        await bob.post(f"/leases/{lease['id']}/release")
        await exporter.beat(lab_devices())  # freed after the wait: granted in that transaction
        granted = (await api.post(f"/tickets/{falls_back['ticket']}/claim")).json()
        assert granted["state"] == "claimed" and granted["lease"]["device"] == "hw0", granted
        assert (await api.get(f"/tickets/{only_vm['ticket']}")).json()["state"] == "waiting"
        await bob.post(f"/leases/{held['vm0']['id']}/release")
        await exporter.beat(lab_devices())
        assert (await api.post(f"/tickets/{only_vm['ticket']}/claim")).json()["lease"]["device"] == "vm0"


async def test_a_real_hw_ticket_never_takes_a_virtual_device(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, exporter = await started(client)
        bob = client("bob")
        vm = (await reserve(bob, device="vm0")).json()
        for needs in ("real-hw", "real-hw"):
            assert (await reserve(bob, needs=needs)).status_code == 201
        ticket = (await reserve(api, needs="real-hw", queue=True)).json()
        assert ticket["state"] == "waiting" and ticket["needs"] == "real-hw" and ticket["fallback"] is None
        await bob.post(f"/leases/{vm['id']}/release")
        await exporter.beat(lab_devices())
        clock.advance(3600)
        await exporter.beat(lab_devices())
        await rules.reap()
        assert (await api.get(f"/tickets/{ticket['ticket']}")).json()["state"] == "waiting", \
            "vm0 and vm1 are free, and not what it needs"
        listed = (await api.get("/tickets")).json()
        assert [(t["needs"], t["fallback"]) for t in listed] == [("real-hw", None)]


@pytest.mark.parametrize("body, says", [
    ({"needs": "gpu"}, "needs"),
    ({"needs": "real-hw", "fallback": "real-hw"}, "fallback goes with needs 'any'"),
    ({"fallback": "real-hw", "tags": ["x"]}, "fallback goes with needs 'any'"),
    ({"needs": "any", "fallback": "any"}, "the only fallback is 'real-hw'"),
    ({"needs": "any", "fallback_after_s": 30}, "fallback_after goes with fallback"),
    ({"needs": "any", "fallback": "real-hw", "fallback_after_s": 1e12}, "fallback_after_s: Input should be less "
                                                                         "than or equal to 86400"),
    ({"needs": "any", "fallback": "real-hw", "fallback_after_s": -1}, "fallback_after_s: Input should be greater "
                                                                       "than or equal to 0"),
    ({"needs": "any", "fallback": "real-hw", "fallback_after_s": "soon"}, "fallback_after_s"),
    ({"needs": ["any"]}, "needs"),
])
async def test_hostile_needs_are_refused_with_a_clear_message(tmp_path, body, says):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, _ = await started(client)
        refused = await reserve(api, **body)
        assert refused.status_code == 422, refused.text
        assert says in refused.json()["message"], refused.json()
        assert (await api.get("/tickets")).json() == [] and (await api.get("/leases")).json() == []


async def test_a_jobs_cells_reserve_with_its_needs(tmp_path):
    """JobSpec.needs (and its fallback) decide what a cell's lease may be, never the worker."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, _ = await started(client)
        any_job = (await api.post("/jobs", json={"spec": {"run": ["true"], "needs": "any", "target": {
            "tags": ["avx2"]}}, "claim": True})).json()
        lease = (await api.post(f"/jobs/{any_job['id']}/reserve", json={"cell": 0, "tags": ["avx2"]})).json()
        assert lease["device"] == "vm0", lease
        real_job = (await api.post("/jobs", json={"spec": {"run": ["true"], "target": {"tags": ["avx2"]}},
                                                  "claim": True})).json()
        assert real_job["spec"]["needs"] == "real-hw", "a job's default"
        lease = (await api.post(f"/jobs/{real_job['id']}/reserve", json={"cell": 0, "tags": ["avx2"]})).json()
        assert lease["device"] in ("sim0", "hw0"), lease
        waiting = (await api.post("/jobs", json={"spec": {"run": ["true"], "needs": "any", "fallback": "real-hw",
                                                          "fallback_after_s": 5}, "claim": True})).json()
        both = [(await api.post(f"/jobs/{waiting['id']}/reserve", json={"cell": 0})).json() for _ in range(2)]
        assert [b.get("device") for b in both] == ["vm1", None] and both[1]["needs"] == "any", both
        assert "real-hw after 5s" in both[1]["wants"]
        listed = {j["id"]: j for j in (await api.get("/jobs")).json()}
        assert (listed[any_job["id"]]["needs"], listed[waiting["id"]]["fallback"]) == ("any", "real-hw")
        for spec, says in (({"run": ["true"], "fallback": "real-hw"}, "fallback goes with needs 'any'"),
                           ({"run": ["true"], "needs": "any", "fallback": "real-hw", "fallback_after_s": 1e9},
                            "fallback_after_s"),
                           ({"run": ["true"], "needs": "some"}, "needs")):
            refused = await api.post("/jobs", json={"spec": spec})
            assert refused.status_code == 422 and says in refused.json()["message"], refused.text


# ---- the ISA matrix on emulated devices (docs/architecture.md, "Jobs and evidence") ---------------

def isa_slots() -> list[dict]:
    """Three emulated VM slots of one host, an ISA each, and a simulated board with SVE2 that a
    matrix with needs any must never take."""
    emulated = {"fidelity": "emulated", "device_class": "qemu", "facts": {FIDELITY_DETAIL: "TCG"}}
    return [device("vm-arm", tags=("virtual", "aarch64", "sve2"), **emulated),
            device("vm-rv", tags=("rvv",), **emulated),
            device("vm-x86", tags=("virtual", "x86_64", "avx2"), **emulated),
            device("sve-board", fidelity="simulated", tags=("sve2",))]


async def test_an_isa_matrix_with_needs_any_runs_its_cells_side_by_side_on_emulators(tmp_path):
    """Each cell on the emulated slot of its ISA, all leased at once; a group no device has is
    "not run: no device" (the runner's refusal codes); the evidence says functional, not for
    timing, beside every device and in every verdict line."""
    from device_loop.client.runner import NO_SUCH_DEVICE, SAYS_NO_DEVICE
    from device_loop.core.ab import fingerprint

    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        assert (await exporter.beat(isa_slots())).status_code == 200
        groups = ["tags=sve2", "tags=rvv", "tags=avx2", "tags=avx512f"]
        job = (await api.post("/jobs", json={"claim": True, "spec": {
            "title": "SIMD kernels agree", "needs": "any", "matrix": {"over": groups},
            "metrics": [{"name": "checksum_ms", "unit": "ms"}],
            "ab": {"baseline": ["./kernel --scalar"], "patch": ["./kernel --simd"], "rounds": 6, "warmup": 0}}})).json()
        leases = {}
        for cell, group in enumerate(groups):  # as the runner's cells do, each in its own thread
            tags = group.split("=")[1].split(",")
            answer = await api.post(f"/jobs/{job['id']}/reserve", json={"cell": cell, "tags": tags})
            if cell == 3:
                refusal = answer.json()
                assert answer.status_code == 404 and refusal["error"] in NO_SUCH_DEVICE, refusal
                assert refusal["error"] in SAYS_NO_DEVICE and refusal["message"].startswith("no device")
                continue
            assert answer.status_code == 201, answer.text
            leases[cell] = answer.json()
        assert [leases[c]["device"] for c in range(3)] == ["vm-arm", "vm-rv", "vm-x86"], "never the SVE2 board"
        live = [lease for lease in (await api.get("/leases")).json()]
        assert len(live) == 3, "the three cells hold their slots at the same time"

        for cell, lease in leases.items():
            shown = (await api.get(f"/devices/{lease['device']}")).json()
            made = fingerprint.gather(lambda command, timeout_s: _NoOutput(), lease, shown, "test")
            assert (made.fidelity, made.fidelity_detail, made.emulated) == ("emulated", "TCG", True)
            report = {"cell": cell, "group": groups[cell], "device": lease["device"], "lease_id": lease["id"],
                      "fingerprint": made.model_dump(mode="json", by_alias=True)}
            assert (await api.post(f"/jobs/{job['id']}/cells", json=report)).status_code == 200
            for seq in range(12):
                value = 10 + seq % 2 * 0.01 + seq / 1000
                await api.post(f"/jobs/{job['id']}/runs", json={
                    "cell": cell, "seq": seq, "arm": "AB"[seq % 2], "started_at": 1.0 + seq, "ended_at": 1.5 + seq,
                    "status": 0, "samples": [{"metric": "checksum_ms", "value": value}]})
        not_run = {"cell": 3, "group": "tags=avx512f", "not_run": "no device in the lab is with tag avx512f"}
        assert (await api.post(f"/jobs/{job['id']}/cells", json=not_run)).status_code == 200
        assert (await api.post(f"/jobs/{job['id']}/finish", json={"state": "done"})).status_code == 200

        evidence = (await api.get(f"/jobs/{job['id']}/evidence")).text
        assert "**Functional evidence only: every device it ran on is emulated (TCG): not for timing.**" in evidence
        verdicts = [line for line in evidence.splitlines() if line.startswith("- checksum")]
        assert len(verdicts) == 3 and all(line.endswith("; emulated (TCG): not for timing.") for line in verdicts), \
            verdicts
        for name in ("vm-arm", "vm-rv", "vm-x86"):
            assert f"### cell {[d['device'] for d in leases.values()].index(name)}: {name} " in evidence
        headings = [line for line in evidence.splitlines() if line.startswith("### cell")]
        assert all(h.endswith(", emulated (TCG): not for timing") for h in headings if "avx512f" not in h), headings
        assert "- fidelity: emulated (TCG): not for timing" in evidence
        assert "Not run (tags=avx512f): no device" in evidence
        summary = evidence.split("## Summary", 1)[1].split("## Results", 1)[0]
        assert summary.count("emulated (TCG): not for timing") == 3, summary
        page = (await api.get(f"{SITE}/jobs/{job['id']}")).text
        assert page.count('<span class="mark">emulated (TCG): not for timing</span>') == 3
        assert '<span class="needs">needs any</span>' in page
        listed = (await api.get(f"{SITE}/jobs")).text
        assert '<td data-label="Needs">any</td>' in listed


class _NoOutput:
    """What an exec on a slot that printed nothing answers (the fingerprint's reads come back empty)."""
    stdout, status, channel = "", 0, "console"


async def test_a_plain_board_job_is_not_labelled_functional(tmp_path):
    from device_loop.core.ab.evidence import functional_only
    from device_loop.core.ab.jobs import CellReport, Fingerprint, JobSpec, JobView

    spec = JobSpec.model_validate({"run": ["true"]})
    cells = [CellReport(cell=0, device="hw0", fingerprint=Fingerprint(device="hw0", fidelity="hardware")),
             CellReport(cell=1, device="vm0", fingerprint=Fingerprint(device="vm0", fidelity="emulated",
                                                                      fidelity_detail="TCG", emulated=True))]
    job = JobView(id="job-1", owner="ann", kind="interactive", state="done", spec=spec, created_at=1.0, cells=cells)
    assert functional_only(job) == "", "one device it ran on is for timing"
    assert functional_only(job.model_copy(update={"cells": cells[1:]})).endswith("emulated (TCG): not for timing.")
    simulated = Fingerprint(device="sim0", fidelity="simulated", emulated=True)
    assert simulated.timing_note == "simulated: not for timing" and simulated.what == "simulated"
    assert Fingerprint(device="old", emulated=True).timing_note == "emulated: not for timing", "a stored one"
    assert Fingerprint(device="vm1", fidelity="virtual", fidelity_detail="KVM").timing_note == ""


# ---- what people and agents see ------------------------------------------------------------------

async def test_the_board_device_page_api_and_mcp_show_fidelity_and_tickets_their_needs(tmp_path):
    import httpx2
    from mcp.client.client import Client
    from mcp.client.streamable_http import streamable_http_client

    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, exporter = await started(client)
        devices = {d["name"]: d for d in (await api.get("/devices")).json()}
        assert {n: d["fidelity"] for n, d in devices.items()} == {"sim0": "simulated", "hw0": "hardware",
                                                                  "vm0": "emulated", "vm1": "virtual"}
        assert devices["vm0"]["facts"] == {FIDELITY_DETAIL: "TCG"}
        await reserve(client("bob"), device="vm1")
        await reserve(client("bob"), device="vm0")
        ticket = (await reserve(api, needs="any", fallback="real-hw", fallback_after_s=120, queue=True)).json()

        board = (await api.get(f"{SITE}/")).text
        assert '<span class="fidelity f-emulated">emulated (TCG)</span> <span class="mark"' in board
        assert '<span class="fidelity f-virtual">virtual (KVM)</span></td>' in board, "a VM is for timing"
        assert '<span class="fidelity f-simulated">simulated</span> <span class="mark"' in board
        assert board.count("not for timing") == 2 and "<th>Fidelity</th>" in board
        assert "(needs any, real-hw after 2m)" in board, "the queue says what a ticket may run on"
        assert '<option value="any">needs any</option>' in board, "the board's reserve form asks what it needs"
        page = (await api.get(f"{SITE}/devices/vm0")).text
        assert "emulated (TCG)" in page and "not for timing" in page

        app = client.app
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), headers={"X-Device-Loop-User": "carl"},
                                  timeout=30)
        async with Client(streamable_http_client("http://127.0.0.1/mcp", http_client=http)) as agent:
            listed = (await agent.call_tool("list_devices", {})).structured_content["devices"]
            assert {d["name"]: d["fidelity"] for d in listed}["vm0"] == "emulated"
            info = (await agent.call_tool("device_info", {"device": "vm0"})).structured_content
            assert info["fidelity"] == "emulated" and info["facts"][FIDELITY_DETAIL] == "TCG"
            refused = await agent.call_tool("reserve", {"device": "sim0", "needs": "any"})
            assert refused.is_error and "[wrong_fidelity]" in refused.content[0].text
            assert "sim0 is simulated" in refused.content[0].text
            queued = (await agent.call_tool("reserve", {"needs": "any", "queue": True})).structured_content
            assert queued["needs"] == "any" and queued["kind"] == "batch"
            bad = await agent.call_tool("reserve", {"needs": "any", "fallback_after_s": 5})
            assert bad.is_error and "fallback_after goes with fallback" in bad.content[0].text
        mine = (await api.get(f"/tickets/{ticket['ticket']}")).json()
        assert (mine["needs"], mine["fallback"]) == ("any", "real-hw") and mine["fallback_at"]


def test_ls_shows_each_device_s_fidelity(monkeypatch):
    from click.testing import CliRunner

    from device_loop.cli.commands import ls_command
    from device_loop.client.lab import Lab

    shown = [{**answer, "state": "idle", "host": "host-a", "holder": None, "expires_at": None, "resources": [],
              "fidelity": fidelity, "facts": facts}
             for answer, fidelity, facts in (({"name": "vm0", "class": "qemu"}, "emulated", {FIDELITY_DETAIL: "TCG"}),
                                             ({"name": "sim0", "class": "sim-board"}, "simulated", {}))]
    monkeypatch.setattr(Lab, "devices", lambda self, **kwargs: shown)
    done = CliRunner().invoke(ls_command, ["--coordinator", "http://127.0.0.1:9", "--user", "ann"],
                              obj={"coordinator": None, "user": None})
    assert done.exit_code == 0, done.output
    header, *rows = done.output.splitlines()
    assert header.split()[:4] == ["NAME", "CLASS", "FIDELITY", "STATE"]
    assert rows[0].split()[:5] == ["vm0", "qemu", "emulated", "(TCG)", "idle"] and rows[1].split()[2] == "simulated"


def test_a_fingerprint_says_what_the_device_is_and_how():
    from device_loop.cli.exec import fingerprint_text

    said = fingerprint_text({"device": "vm0", "class": "qemu", "fidelity": "emulated", "fidelity_detail": "TCG",
                             "emulated": True})
    assert "fidelity     emulated (TCG): not for timing" in said, said
    assert "fidelity     virtual (KVM)" in fingerprint_text({"device": "vm1", "fidelity": "virtual",
                                                              "fidelity_detail": "KVM"})


async def test_a_fallback_that_waits_nothing_takes_a_virtual_device_first(tmp_path):
    """Virtual devices go first wherever a fallback could take a board: by name the boards
    (hw0, sim0) come before vm0, and idle as long."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, _ = await started(client)
        body = {"needs": "any", "fallback": "real-hw", "fallback_after_s": 0}
        picks = [(await reserve(api, **body)).json()["device"] for _ in range(4)]
        assert sorted(picks[:2]) == ["vm0", "vm1"] and sorted(picks[2:]) == ["hw0", "sim0"], picks
        waits = (await reserve(api, **body, tags=["avx2"], queue=True)).json()
        clock.advance(1)
        plain = (await reserve(api, tags=["avx2"], queue=True)).json()
        assert (waits["position"], plain["position"]) == (1, 1), "a place in the line of what each needs"


def test_reserve_s_flags_say_what_goes_with_what():
    from click.testing import CliRunner

    from device_loop.cli.commands import reserve_command

    for args, says in ((["--fallback", "real-hw", "--tags", "x"], "--fallback goes with --needs any"),
                       (["--needs", "real-hw", "--fallback", "real-hw"], "--fallback goes with --needs any"),
                       (["--needs", "any", "--fallback-after", "30s"], "--fallback-after goes with --fallback"),
                       (["--needs", "gpu"], "'gpu' is not one of 'real-hw', 'any'")):
        done = CliRunner().invoke(reserve_command, ["--coordinator", "http://127.0.0.1:9", "--user", "ann", *args],
                                  obj={"coordinator": None, "user": None})
        assert done.exit_code == 2 and says in done.output, done.output
