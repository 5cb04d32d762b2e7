"""Power end to end (docs/architecture.md, "Power"): a real coordinator and exporter, simulated
boards whose switch is a file, Debian's pdudaemon writing that file through its localcmdline
driver; what the board's console showed decides the verdict."""
import socket
import time

import pytest

from conftest import WAIT_S, Exporter, wait_for
from helpers import device, reserve, run_cli, wait_active, wait_state
from test_power_backends import pdudaemon, start  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]
HANG_S = 60  # how long the hung board's switch command would run
HUNG_TIMEOUT_S = 0.5  # the hung board's switch timeout: its command is killed then
BOB = {"X-Device-Loop-User": "bob"}


def board(name: str, switch, power: dict, **more) -> dict:
    return {"name": name, "class": "sim-board", **more,
            "resources": [{"plugin": "sim", "power_switch": str(switch)}, {"plugin": "power", **power}]}


def power(coordinator, lease_id: str, action: str, headers=None, **args):
    return coordinator.api(f"/leases/{lease_id}/power", "POST", json={"action": action, **args},
                           **({"headers": headers} if headers else {}))


def finished(coordinator, op: dict, timeout=WAIT_S) -> dict:
    def ended():
        now = coordinator.api(f"/ops/{op['id']}", params={"wait": 5, "unless": "running"}).json()
        return now if now["state"] in ("done", "failed") else None
    return wait_for(ended, timeout, what=f"{op['id']} ended")


def console(lease: dict) -> socket.socket:
    (endpoint,) = [e for e in lease["endpoints"] if e.get("role") == "console"]
    return socket.create_connection((endpoint["host"], endpoint["port"]), timeout=5)


def log_causes(coordinator, name: str) -> list[str]:
    return [e["cause"] for e in coordinator.api(f"/devices/{name}/log").json()]


CONSOLE_TIMEOUT_S = 10.0  # how long a cycle waits for the console's first byte after power-on


def test_a_cycle_through_pdudaemon_silences_the_console_hangs_up_its_pty_and_is_verified_by_the_banner(
        coordinator, tmp_path, env, exporters, pdudaemon):  # noqa: F811
    port, outlets = pdudaemon
    exporters.append(Exporter(tmp_path, env, coordinator.url, [
        board("sim-board-0", outlets / "1", {"backend": "pdudaemon", "port": port, "pdu": "pdu01", "outlet": 1,
                                             "console_timeout": f"{CONSOLE_TIMEOUT_S:g}s"})]))
    wait_state(coordinator, "sim-board-0", "idle")
    lease = wait_active(coordinator, reserve(coordinator, "sim-board-0")["id"])
    with console(lease) as uart:  # a person watching the console across the cycle
        uart.settimeout(0.2)
        asked = power(coordinator, lease["id"], "cycle", off_time_s=1.5)
        assert asked.status_code == 201, asked.text
        assert power(coordinator, lease["id"], "cycle", headers=BOB).status_code == 404  # not bob's lease
        op = finished(coordinator, asked.json())
        seen = b""
        deadline = time.monotonic() + WAIT_S
        while b"simulated board sim-board-0" not in seen and time.monotonic() < deadline:
            try:
                seen += uart.recv(4096)
            except TimeoutError:
                pass
    assert op["state"] == "done", op
    result = op["result"]
    assert result["verdict"] == "verified", result
    assert result["console_silent"] is True and result["console_hung_up"] is True, result
    assert 0 <= result["first_byte_s"] < CONSOLE_TIMEOUT_S and result["off_s"] >= 1.5, result
    assert result["backend"] == "pdudaemon" and result["state_after_off"] is None
    assert b"simulated board sim-board-0" in seen, "the person at the console sees the board boot again"
    assert (outlets / "1").read_text() == "on"
    assert any("first console byte" in cause and "verified" in cause
               for cause in log_causes(coordinator, "sim-board-0"))
    audit = coordinator.api("/admin/audit").json()
    mine = [entry for entry in audit if entry["device"] == "sim-board-0"]
    assert any(e["action"] == "power" and e["actor"] == "alice" and e["detail"]["args"] == {"action": "cycle",
                                                                                          "off_time_s": 1.5}
               for e in mine), mine
    assert any(e["action"] == "power_done" and e["detail"]["op"] == op["id"]
               and e["detail"]["result"]["verdict"] == "verified" and e["detail"]["result"]["backend"] == "pdudaemon"
               for e in mine), mine

    # pdudaemon cannot say whether an outlet is on, and status does not watch the console
    status = run_cli(env, coordinator.url, "power", "status", "sim-board-0", check=False)
    assert status.returncode == 3 and "unverified" in status.stdout, status.stdout + status.stderr
    refused = run_cli({**env, "DEVICE_LOOP_USER": "bob"}, coordinator.url, "power", "cycle", "sim-board-0",
                      check=False)
    assert refused.returncode != 0 and "held by alice" in refused.stderr
    # (the trust mode makes everyone an admin: the admin route refuses a device someone holds;
    # in a lab with tokens it is admins only, as tests/test_access.py holds every route to)
    taken = coordinator.api("/admin/devices/sim-board-0/power", "POST", json={"action": "off"}, headers=BOB)
    assert taken.status_code == 409 and "held by alice" in taken.json()["message"], taken.text


def test_a_command_backend_reads_back_and_a_hung_one_is_killed_at_its_timeout(coordinator, tmp_path, env, exporters):
    switch = tmp_path / "switch"
    flip = ["sh", "-c", f"echo $0 > {switch}"]
    exporters.append(Exporter(tmp_path, env, coordinator.url, [
        board("cmd-board", switch, {"backend": "command", "on": [*flip, "on"], "off": [*flip, "off"],
                                    "status": ["cat", f"{switch}.state"]}),
        board("hung-board", tmp_path / "other", {"backend": "command", "on": ["sleep", str(HANG_S)], "off": ["true"],
                                                 "timeout": f"{HUNG_TIMEOUT_S:g}s"})]))
    for name in ("cmd-board", "hung-board"):
        wait_state(coordinator, name, "idle")
    lease = wait_active(coordinator, reserve(coordinator, "cmd-board")["id"])
    off = finished(coordinator, power(coordinator, lease["id"], "off").json())
    assert off["state"] == "done" and off["result"]["verdict"] == "verified", off
    assert "read back from the switch: off" in off["message"] and "its console hung up" in off["result"]["how"]
    on = finished(coordinator, power(coordinator, lease["id"], "on").json())
    assert on["result"]["verdict"] == "verified" and on["result"]["first_byte_s"] is not None, on
    # switched off and given back: not handed to the next person dead
    assert finished(coordinator, power(coordinator, lease["id"], "off").json())["state"] == "done"
    assert coordinator.api(f"/leases/{lease['id']}/release", "POST").status_code == 200
    wait_state(coordinator, "cmd-board", "faulty")
    assert "switched off by alice" in device(coordinator, "cmd-board")["reason"]
    again = coordinator.api("/admin/devices/cmd-board/power", "POST", json={"action": "on"})
    assert again.status_code == 201, again.text
    assert finished(coordinator, again.json())["state"] == "done"
    wait_state(coordinator, "cmd-board", "idle")

    hung = wait_active(coordinator, reserve(coordinator, "hung-board")["id"])
    began = time.monotonic()
    stuck = finished(coordinator, power(coordinator, hung["id"], "on").json())
    assert stuck["state"] == "failed" and f"did not finish within {HUNG_TIMEOUT_S:g}s; killed it" in stuck["message"], \
        stuck
    assert time.monotonic() - began < HANG_S / 3, "killed at its timeout, not left to run its course"
    for refused in (power(coordinator, hung["id"], "dance"), power(coordinator, hung["id"], "on", off_time_s=2),
                    power(coordinator, hung["id"], "cycle", off_time_s=601),
                    power(coordinator, hung["id"], "cycle", off_time_s="soon"),
                    coordinator.api(f"/leases/{hung['id']}/operations", "POST",
                                    json={"kind": "power", "args": {"action": "dance"}}),
                    coordinator.api(f"/leases/{hung['id']}/operations", "POST",
                                    json={"kind": "power", "args": {"action": "off", "off_time_s": 1}})):
        assert refused.status_code == 422, refused.text


# how long the unfed board's cycles wait for a first byte: the first cycle's, time for its holder
# to press Enter once the test saw it booting; the second's, waited out (nothing comes)
UNFED_CONSOLE_TIMEOUT_S = 2.0


def test_an_idle_board_that_stays_silent_and_an_echo_after_on_verify_nothing(coordinator, tmp_path, env, exporters):
    """A switch that does not feed the board (the wrong outlet): the idle board says nothing
    while "off", and what it prints after "on" is the echo of a key its holder pressed."""
    exporters.append(Exporter(tmp_path, env, coordinator.url, [
        board("unfed", tmp_path / "unfed.power", {"backend": "command", "on": ["true"], "off": ["true"],
                                                  "console_timeout": f"{UNFED_CONSOLE_TIMEOUT_S:g}s"})]))
    wait_state(coordinator, "unfed", "idle")
    lease = wait_active(coordinator, reserve(coordinator, "unfed")["id"])
    with console(lease) as uart:
        op = power(coordinator, lease["id"], "cycle", off_time_s=1.5).json()
        wait_for(lambda: coordinator.api(f"/ops/{op['id']}").json()["phase"] == "booting",
                 what="the cycle waiting for the first byte")
        uart.sendall(b"\r")  # the holder presses Enter: the board answers with a prompt
        op = finished(coordinator, op)
    assert op["state"] == "done" and op["result"]["verdict"] == "unverified", op
    assert op["result"]["console_silent"] is True and op["result"]["console_hung_up"] is False
    assert "typed" in " ".join(op["result"]["how"]) and op["message"].startswith("unverified"), op
    shown = run_cli(env, coordinator.url, "op", op["id"], check=False)
    assert f"{op['id']}: power of unfed: unverified" in shown.stdout, shown.stdout
    short = finished(coordinator, power(coordinator, lease["id"], "cycle", off_time_s=0).json())
    assert short["result"]["verdict"] == "unverified", short  # no silence to speak of


RECOVERY_HEARTBEAT_S = 0.5


def test_a_hung_board_nobody_holds_is_power_cycled_once_and_a_power_cycle_step_runs_between_leases(
        coordinator, tmp_path, env, exporters):
    exporters.append(Exporter(tmp_path, env, coordinator.url, [
        # a step between leases runs before its health is looked at: the rule waits for it
        {**board("panicky", tmp_path / "panicky.power", {"backend": "sim", "switch": str(tmp_path / "panicky.power")},
                 auto_recover="power-cycle"), "steps": [{"step": "cooldown", "below": "70C", "timeout": "30s"}]},
        # its switch feeds some other board: a cycle changes nothing here, and is never repeated
        board("stubborn", tmp_path / "stubborn.power", {"backend": "command", "on": ["true"], "off": ["true"],
                                                         "off_time": "0.5s", "console_timeout": "1s"},
              auto_recover="power-cycle"),
        {**board("stepped", tmp_path / "stepped.power", {"backend": "sim", "switch": str(tmp_path / "stepped.power")}),
         "steps": [{"step": "power-cycle", "off_time": "0.5s", "timeout": "60s"}]}],
        # (its heartbeats, and so its health checks, twice a second: the rule looks at each report)
        heartbeat_s=RECOVERY_HEARTBEAT_S))
    for name in ("panicky", "stubborn", "stepped"):
        wait_state(coordinator, name, "idle")
    for name in ("panicky", "stubborn"):
        lease = wait_active(coordinator, reserve(coordinator, name)["id"])
        with console(lease) as uart:
            uart.sendall(b"hang\r")
            wait_for(lambda: b"Kernel panic" in uart.recv(4096), what="the panic")
        wait_for(lambda name=name: device(coordinator, name)["health"] == "failed",
                 what=f"{name}'s health failed")
        assert not coordinator.api(f"/devices/{name}/operations", params={"kind": "power"}).json(), \
            "nobody power-cycles a board under its holder"
        assert coordinator.api(f"/leases/{lease['id']}/release", "POST").status_code == 200
    wait_for(lambda: device(coordinator, "panicky")["state"] == "idle", what="panicky recovered")
    [auto] = coordinator.api("/devices/panicky/operations", params={"kind": "power"}).json()
    auto = finished(coordinator, auto)
    assert auto["requester"] == "coordinator" and auto["result"]["verdict"] == "verified", auto
    causes = log_causes(coordinator, "panicky")
    assert any(c.startswith("auto-recover: power-cycling it") for c in causes), causes
    assert any(c.startswith("auto-recover: power cycle") and "verified" in c for c in causes), "\n".join(causes)

    def stubborn_ops():
        return coordinator.api("/devices/stubborn/operations", params={"kind": "power"}).json()
    wait_for(lambda: stubborn_ops() and stubborn_ops()[0]["state"] == "done", what="stubborn's one cycle")
    generation = coordinator.api("/hosts").json()[0]["generation"]
    wait_for(lambda: coordinator.api("/hosts").json()[0]["generation"] >= generation + 3,
             what="three more heartbeats")
    assert len(stubborn_ops()) == 1 and device(coordinator, "stubborn")["state"] == "faulty", "once, then a person"

    lease = wait_active(coordinator, reserve(coordinator, "stepped")["id"])
    assert coordinator.api(f"/leases/{lease['id']}/release", "POST").status_code == 200
    wait_for(lambda: any("power-cycle" in c for c in log_causes(coordinator, "stepped")), what="the step")
    wait_state(coordinator, "stepped", "idle")
