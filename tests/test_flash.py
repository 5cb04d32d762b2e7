"""Mediated flash end to end: a real coordinator and exporter, the flash plugin's backends
writing real files and running real programs (Debian's fastboot), the CLI and an agent."""
import hashlib
import json
import os
import signal
import subprocess
import time

import anyio
import pytest

from conftest import HEARTBEAT_S, WAIT_S, wait_for
from helpers import device, run_cli, wait_state
from test_mcp import agent, call

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


def flashable(name: str, **flash) -> dict:
    """A simulated board with a flash target."""
    return {"name": name, "class": "sim-board", "resources": [{"plugin": "sim"}, {"plugin": "flash", **flash}]}


def image_file(tmp_path, name: str, size: int = 8 << 20) -> tuple:
    path = tmp_path / f"{name}.img"
    path.write_bytes(os.urandom(size))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def cli_json(env, coordinator, *args, check=True) -> dict:
    result = run_cli(env, coordinator.url, *args, "--json", check=check)
    return json.loads(result.stdout)


def golden_and(tmp_path, env, coordinator, name: str) -> tuple:
    """Two 1 MiB images uploaded for class sim-board: ``golden`` (known-good) and ``name``."""
    golden, _ = image_file(tmp_path, "golden", 1 << 20)
    other, _ = image_file(tmp_path, name, 1 << 20)
    cli_json(env, coordinator, "images", "upload", str(golden), "--name", "golden", "--for", "sim-board")
    cli_json(env, coordinator, "images", "mark-good", "golden", "--for", "sim-board")
    cli_json(env, coordinator, "images", "upload", str(other), "--name", name, "--for", "sim-board")
    return golden, other


def op(coordinator, op_id: str) -> dict:
    return coordinator.api(f"/ops/{op_id}").json()


def wait_op(coordinator, op_id: str, predicate, what: str, timeout: float = WAIT_S) -> dict:
    def seen():
        current = op(coordinator, op_id)
        return current if predicate(current) else None
    return wait_for(seen, timeout, what=what)


def test_a_flash_writes_the_image_verifies_it_and_is_audited(tmp_path, env, coordinator, exporter_factory):
    target = tmp_path / "board0.img"
    target.write_bytes(b"factory" * 1000)
    exporter_factory([flashable("sim-board-0", target=str(target))])
    wait_state(coordinator, "sim-board-0", "idle")
    build, sha = image_file(tmp_path, "build")
    cli_json(env, coordinator, "images", "upload", str(build), "--name", "build-1", "--for", "sim-board-0")
    lease = cli_json(env, coordinator, "reserve", "sim-board-0", "--wait")
    assert lease["ready"] and [e["kind"] for e in lease["endpoints"]] == ["uart"], "the flash target is not served"

    done = cli_json(env, coordinator, "flash", "sim-board-0", "build-1")
    assert (done["state"], done["phase"], done["done_bytes"]) == ("done", "verifying", build.stat().st_size)
    assert "verified by read-back" in done["message"]
    assert done["result"] == {"verified": True, "sha256": sha}, "what a reserve's --image reads"
    assert target.read_bytes() == build.read_bytes()
    audit = coordinator.api("/admin/audit").json()
    asked = next(a for a in audit if a["action"] == "flash")
    assert (asked["actor"], asked["device"], asked["lease"]) == ("alice", "sim-board-0", lease["id"])
    assert (asked["detail"]["image"], asked["detail"]["sha256"], asked["detail"]["op"]) == ("build-1", sha, done["id"])
    assert any(a["action"] == "flash_done" and a["detail"]["op"] == done["id"] for a in audit)
    assert cli_json(env, coordinator, "op", done["id"])["state"] == "done"
    by_prefix = cli_json(env, coordinator, "flash", "sim-board-0", sha[:12])  # as `images ls` prints it
    assert by_prefix["image"]["name"] == "build-1"
    history = cli_json(env, coordinator, "flashes", "sim-board-0")
    assert [h["id"] for h in history] == [by_prefix["id"], done["id"]]

    # the exporter's cache has it now: the registry's copy is not needed again
    (tmp_path / "coord" / "images" / sha).unlink()
    target.write_bytes(b"scribbled over")
    again = cli_json(env, coordinator, "flash", "sim-board-0", "build-1")
    assert again["state"] == "done" and target.read_bytes() == build.read_bytes()

    target.unlink()
    target.mkdir()  # a target that cannot even be opened: the flash fails and the device was not touched
    # (a scan between the two lines saw no target at all: its health failed, and says so; wait that out)
    wait_for(lambda: device(coordinator, "sim-board-0")["health"] == "ok", what="its health ok again")
    refused = run_cli(env, coordinator.url, "flash", "sim-board-0", "build-1", "--json", check=False)
    said = json.loads(refused.stdout)
    assert refused.returncode == 1 and "cannot open the flash target" in said["message"], said
    assert "the device was not changed" in said["message"]
    assert not coordinator.api("/devices/sim-board-0").json()["needs_recovery"]


def test_heartbeats_and_other_leases_go_on_during_a_long_flash(tmp_path, env, coordinator, exporter_factory):
    out, done_writing = tmp_path / "written.img", tmp_path / "done-writing"
    # a flash as long as the test needs: its tool writes once the test lets it
    slow_tool = f"sh -c 'until [ -e {done_writing} ]; do sleep 0.05; done; cp \"$0\" \"$1\"' {{image}} {out}"
    exporter_factory([flashable("sim-board-0", command=slow_tool), {"name": "sim-board-1", "plugin": "sim",
                                                                    "class": "sim-board"}])
    wait_state(coordinator, "sim-board-1", "idle")
    build, _ = image_file(tmp_path, "build", 1 << 20)
    cli_json(env, coordinator, "images", "upload", str(build), "--name", "build-1", "--for", "sim-board")
    cli_json(env, coordinator, "reserve", "sim-board-0", "--wait")
    op_id = run_cli(env, coordinator.url, "flash", "sim-board-0", "build-1", "--detach").stdout.strip()
    try:
        wait_op(coordinator, op_id, lambda o: o["phase"] == "writing", "the slow tool to run")
        other = cli_json(env, coordinator, "reserve", "sim-board-1", "--wait", "--timeout", f"{WAIT_S:g}s")
        assert other["ready"], "another lease of the host is served during the flash"
        # (the coordinator takes a host for offline after 3 periods of silence: 3 heartbeats, each
        # on time, while the flash writes)
        ages: list[float] = []
        since = coordinator.api("/hosts").json()[0]["generation"]

        def beaten() -> bool:
            (host,) = coordinator.api("/hosts").json()
            ages.append(host["heartbeat_age_s"])
            return host["generation"] >= since + 3
        wait_for(beaten, interval=0.25, what="3 heartbeats during the flash")
        assert op(coordinator, op_id)["phase"] == "writing", "the flash was writing all along"
        assert max(ages) < 2.5 * HEARTBEAT_S, f"heartbeats stalled during the flash: {ages}"
    finally:
        done_writing.touch()
    finished = wait_op(coordinator, op_id, lambda o: o["state"] != "running", "the flash's end")
    assert finished["state"] == "done" and "written by sh" in finished["message"]
    assert out.read_bytes() == build.read_bytes()


def test_an_image_altered_in_the_registry_is_never_written(tmp_path, env, coordinator, exporter_factory):
    target = tmp_path / "board0.img"
    target.write_bytes(b"factory")
    exporter_factory([flashable("sim-board-0", target=str(target))])
    wait_state(coordinator, "sim-board-0", "idle")
    build, sha = image_file(tmp_path, "build", 1 << 20)
    made = cli_json(env, coordinator, "images", "upload", str(build), "--for", "device:sim-board-0")
    assert made["name"] == "build.img", "an image is named after its file unless told otherwise"
    stored = tmp_path / "coord" / "images" / sha
    damaged = bytearray(stored.read_bytes())
    damaged[1000] ^= 0xFF
    stored.write_bytes(damaged)
    cli_json(env, coordinator, "reserve", "sim-board-0", "--wait")

    refused = run_cli(env, coordinator.url, "flash", "sim-board-0", "build.img", "--json", check=False)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    said = json.loads(refused.stdout)
    assert said["error"] == "flash_failed" and "nothing written" in said["message"]
    assert "the device was not changed" in said["message"]
    assert op(coordinator, said["op"])["phase"] == "fetching"
    assert target.read_bytes() == b"factory"
    assert not coordinator.api("/devices/sim-board-0").json()["needs_recovery"]


def test_kill_9_while_writing_needs_recovery_and_recover_brings_it_back(tmp_path, env, coordinator, exporter_factory):
    out = tmp_path / "written.img"
    # the tool sleeps when asked to write build-slow: the exporter is killed meanwhile
    tool = f"sh -c 'if [ \"$2\" = build-slow ]; then sleep 61.5; fi; cp \"$0\" \"$1\"' {{image}} {out} {{name}}"
    devices = [flashable("sim-board-0", command=tool)]
    exporter = exporter_factory(devices)
    wait_state(coordinator, "sim-board-0", "idle")
    golden, _ = golden_and(tmp_path, env, coordinator, "build-slow")
    lease = cli_json(env, coordinator, "reserve", "sim-board-0", "--wait")
    op_id = run_cli(env, coordinator.url, "flash", "sim-board-0", "build-slow", "--detach").stdout.strip()
    wait_op(coordinator, op_id, lambda o: o["phase"] == "writing", "the write to begin")

    exporter.stop(signal.SIGKILL)
    assert subprocess.run(["pgrep", "-f", "sleep 61.5"], capture_output=True).returncode == 0
    exporter_factory(devices)  # the same host, started again
    failed = wait_op(coordinator, op_id, lambda o: o["state"] != "running", "the flash to be found interrupted")
    assert failed["state"] == "failed" and "interrupted while writing" in failed["message"]
    wait_for(lambda: subprocess.run(["pgrep", "-f", "sleep 61.5"]).returncode == 1,
             what="the dead exporter's flash tool to be stopped by the next start")
    info = coordinator.api("/devices/sim-board-0").json()
    assert info["needs_recovery"] and info["holder"] == "alice"
    bob = run_cli(env, coordinator.url, "--user", "bob", "reserve", "sim-board-0", "--json", check=False)
    assert bob.returncode == 1 and json.loads(bob.stdout)["error"] == "busy"  # alice still holds it

    recovered = cli_json(env, coordinator, "recover", "sim-board-0")
    assert (recovered["state"], recovered["purpose"], recovered["image"]["name"]) == ("done", "recover", "golden")
    assert out.read_bytes() == golden.read_bytes()
    assert not coordinator.api("/devices/sim-board-0").json()["needs_recovery"]
    run_cli(env, coordinator.url, "release", lease["id"])
    wait_state(coordinator, "sim-board-0", "idle")
    assert run_cli(env, coordinator.url, "--user", "bob", "reserve", "sim-board-0", check=False).returncode == 0


def test_fastboot_against_an_absent_phone_ends_within_its_timeout(tmp_path, env, coordinator, exporter_factory):
    serial = "DLNOSUCHPHONE01"
    timeout_s = 3
    exporter_factory([flashable("phone-0", fastboot=serial, partition="boot", timeout=timeout_s)])
    wait_state(coordinator, "phone-0", "idle")
    health = coordinator.api("/devices/phone-0").json()
    assert health["health"] == "degraded" and f"no USB device with serial {serial}" in health["health_reason"]
    build, _ = image_file(tmp_path, "boot", 1 << 20)
    cli_json(env, coordinator, "images", "upload", str(build), "--name", "boot-1", "--for", "phone-0")
    cli_json(env, coordinator, "reserve", "phone-0", "--wait")
    began = time.monotonic()
    failed = run_cli(env, coordinator.url, "flash", "phone-0", "boot-1", "--json", check=False)
    took = time.monotonic() - began
    assert failed.returncode == 1, failed.stdout
    said = json.loads(failed.stdout)
    assert "fastboot boot of DLNOSUCHPHONE01 did not finish within 3s" in said["message"], said
    assert "killed it" in said["message"] and took < 4 * timeout_s, took  # (the CLI's start and the upload too)
    assert subprocess.run(["pgrep", "-f", serial], capture_output=True).returncode == 1, "fastboot was left running"
    assert coordinator.api("/devices/phone-0").json()["needs_recovery"], "it may have been half-written"


@pytest.mark.anyio
async def test_an_agent_flashes_and_recovers(tmp_path, env, coordinator, exporter_factory):
    target = tmp_path / "board0.img"
    target.write_bytes(b"factory")
    exporter_factory([flashable("sim-board-0", target=str(target))])
    wait_state(coordinator, "sim-board-0", "idle")
    golden, build = golden_and(tmp_path, env, coordinator, "build-1")
    async with agent(coordinator.url) as bot:
        assert [i["name"] for i in (await call(bot, "list_images", device="sim-board-0"))["images"]] == [
            "build-1", "golden"]
        lease = await call(bot, "reserve", device="sim-board-0")
        started = await call(bot, "flash", lease_id=lease["id"], image="build-1")
        assert started["state"] == "queued"
        status = started
        for _ in range(20):
            status = await call(bot, "flash_status", op_id=started["id"], wait_s=5)
            if status["state"] in ("done", "failed"):
                break
        assert status["state"] == "done" and target.read_bytes() == build.read_bytes()
        busy = await bot.call_tool("flash", {"lease_id": "lease-nosuch", "image": "build-1"})
        assert busy.is_error and "unknown lease 'lease-nosuch' [unknown_lease]" in busy.content[0].text
        recovering = await call(bot, "recover", lease_id=lease["id"])
        done = await call(bot, "flash_status", op_id=recovering["id"], wait_s=10)
        while done["state"] not in ("done", "failed"):
            await anyio.sleep(0.1)
            done = await call(bot, "flash_status", op_id=recovering["id"], wait_s=5)
        assert done["state"] == "done" and target.read_bytes() == golden.read_bytes()
        await call(bot, "release", lease_id=lease["id"])
