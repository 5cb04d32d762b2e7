"""A new operation kind from a third-party package, end to end: examples/devloop-bootlog
pip-installed into a folder of its own, a real coordinator and exporter, a simulated board
with a ``bootlog`` resource on its console's pty; REST, the CLI, the Python client and an
agent (the MCP SDK's client) each start ``capture-boot-log`` and follow it to the board's
boot banner."""
import json
import os
import shutil
import subprocess
import sys

import anyio
import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import BUILT_IN_PLUGINS, SRC, Exporter
from device_loop.client import Lab
from device_loop.core.plugins import LOAD_ENV
from helpers import reserve, run_cli, wait_active, wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]

EXAMPLE = SRC / "examples" / "devloop-bootlog"
KIND = "capture-boot-log"
BANNER = "device-loop simulated board sim-board-0"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The example pip-installed into a folder (from a copy: pip writes beside the sources)."""
    site = tmp_path_factory.mktemp("bootlog-site")
    source = tmp_path_factory.mktemp("bootlog-source") / "devloop-bootlog"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--disable-pip-version-check", "--target", str(site), str(source)],
                   check=True, capture_output=True, timeout=120)
    assert (site / "devloop_bootlog" / "__init__.py").exists()
    return site


@pytest.fixture
def board(tmp_path, env, coordinator, site):
    """sim-board-0 with a capture-boot-log resource on its console's pty, leased by alice:
    (the coordinator, the lease, the pty's link)."""
    console = tmp_path / "state-host-a" / "sim" / "sim-board-0"  # where the sim plugin links its pty
    device = {"name": "sim-board-0", "class": "sim-board",
              "resources": [{"plugin": "sim"},
                            {"plugin": "bootlog", "path": str(console), "reset_command": "reboot\r",
                             "max_seconds": 10}]}
    path = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    exporter = Exporter(tmp_path, {**env, "PYTHONPATH": path, LOAD_ENV: f"{BUILT_IN_PLUGINS},bootlog"},
                        coordinator.url, [device])
    try:
        wait_state(coordinator, "sim-board-0", "idle")
        lease = wait_active(coordinator, reserve(coordinator, "sim-board-0")["id"])
        yield coordinator, lease, console
    finally:
        exporter.stop()


def assert_captured(op: dict, seconds: float) -> None:
    """``op`` captured this boot of the board: the banner the reset printed, once."""
    assert op["kind"] == KIND and op["state"] == "done", op
    result = op["result"]
    log = result["log"]
    assert "Rebooting..." in log and log.count(BANNER) == 1, f"not this boot's log (or not only): {log!r}"
    assert result["lines"] == len(log.splitlines()) >= 4 and result["bytes"] >= len(log.strip())
    assert op["message"].startswith(f"captured {result['lines']} lines ("), op["message"]
    assert seconds - 0.1 <= result["captured_s"] <= seconds + 1, result
    assert op["progress"] == {"done": seconds, "total": seconds, "unit": "seconds", "detail": ""}


def cli(env, coordinator, *args, check=True):
    return run_cli(env, coordinator.url, *args, check=check)


async def capture_as_an_agent(url: str, lease_id: str) -> dict:
    """An agent starts a capture on alice's lease and follows it, as MCP tools let it."""
    async with httpx2.AsyncClient(headers={"X-Device-Loop-User": "alice"}, timeout=30) as http:
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http)) as agent:
            tools = {tool.name for tool in (await agent.list_tools()).tools}
            assert {"start_operation", "operation_status", "device_operations"} <= tools, tools
            started = await agent.call_tool("start_operation", {"lease_id": lease_id, "kind": KIND,
                                                                "args": {"seconds": 2}})
            assert not started.is_error, started.content
            op = started.structured_content
            assert op["state"] == "queued"
            for _ in range(10):
                status = await agent.call_tool("operation_status", {"op_id": op["id"], "wait_s": 5})
                assert not status.is_error, status.content
                op = status.structured_content
                if op["state"] not in ("queued", "running"):
                    break
            listed = await agent.call_tool("device_operations", {"device": "sim-board-0", "kind": KIND})
            assert listed.structured_content["operations"][0]["id"] == op["id"]
            return op


def test_rest_the_cli_python_and_an_agent_each_capture_the_boot_log(board, env):
    coordinator, lease, _ = board
    info = coordinator.api("/devices/sim-board-0").json()
    (bootlog,) = [r for r in info["resources"] if r["plugin"] == "bootlog"]
    (kind,) = bootlog["operations"]
    assert (kind["kind"], sorted(kind["args"]), kind["exclusive"]) == (KIND, ["seconds", "until"], True)
    assert "at most 10" in kind["args"]["seconds"], "the kind says this board's bounds"
    assert [e["kind"] for e in lease["endpoints"]] == ["uart"], "the bootlog resource serves no lease"

    # REST: started on the lease, followed by long-polls
    started = coordinator.api(f"/leases/{lease['id']}/operations", "POST",
                              json={"kind": KIND, "args": {"seconds": 2}})
    assert started.status_code == 201, started.text
    op = started.json()
    assert (op["state"], op["lease"], op["requester"]) == ("queued", lease["id"], "alice")
    while op["state"] in ("queued", "running"):
        op = coordinator.api(f"/ops/{op['id']}", params={"wait": 5, "unless": op["state"]}).json()
    assert_captured(op, 2)

    # the CLI, on the caller's lease of the device: a number from --arg is sent as one
    said = json.loads(cli(env, coordinator, "op", "run", KIND, "sim-board-0", "--arg", "seconds=2", "--json").stdout)
    assert_captured(said, 2)
    assert said["args"] == {"seconds": 2}
    # for people: the log itself, and a capture cut short by `until` (on the lease, by its id)
    text = cli(env, coordinator, "op", "run", KIND, lease["id"], "--arg", "seconds=5",
               "--arg", "until=sim-board-0:~# ").stdout
    assert BANNER in text and "up to 'sim-board-0:~# '" in text and ": done" in text.splitlines()[0], text

    # the Python client
    lab = Lab(coordinator.url, user="alice")
    try:
        op = lab.lease(lease["id"]).operate(KIND, seconds=2)
        assert_captured(op.data, 2)
        assert repr(op).startswith(f"<Operation {op.id} {KIND} on sim-board-0, done: captured ")
        assert [o.id for o in lab.operations("sim-board-0", kind=KIND)][0] == op.id
        queued = lab.lease(lease["id"]).operate(KIND, wait=False, seconds=1)
        assert queued.state == "queued"
        assert lab.op(queued.id).id == queued.id
        assert_captured(cli_json_wait(env, coordinator, queued.id), 1)
    finally:
        lab.api.close()

    # an agent, through MCP
    assert_captured(anyio.run(capture_as_an_agent, coordinator.url, lease["id"]), 2)


def cli_json_wait(env, coordinator, op_id: str) -> dict:
    return json.loads(cli(env, coordinator, "op", op_id, "--wait", "--json").stdout)


def test_ops_lists_the_captures_and_what_cannot_run_is_refused_clearly(board, env):
    coordinator, lease, console = board
    op_id = cli(env, coordinator, "op", "run", KIND, "sim-board-0", "--arg", "seconds=1", "--detach").stdout.strip()
    assert op_id.startswith("op-")
    assert_captured(cli_json_wait(env, coordinator, op_id), 1)
    shown = cli(env, coordinator, "op", op_id).stdout
    assert shown.startswith(f"{op_id}: {KIND} of sim-board-0: done") and BANNER in shown, shown

    header, row, *rest = cli(env, coordinator, "ops", "sim-board-0").stdout.splitlines()
    assert header.split() == ["OP", "KIND", "STATE", "PHASE", "PROGRESS", "BY", "ASKED", "AT", "MESSAGE"]
    assert row.split()[:5] == [op_id, KIND, "done", "capturing", "1/1"] and " alice " in row and not rest, row
    assert [o["id"] for o in json.loads(cli(env, coordinator, "ops", "sim-board-0", "--kind", KIND,
                                            "--json").stdout)] == [op_id]
    assert cli(env, coordinator, "ops", "sim-board-0", "--kind", "flash").stdout.strip() == \
        "sim-board-0 has run no flash operation"

    # refused by the coordinator, before anything runs: an argument the kind does not take, a kind it does not run
    bad = coordinator.api(f"/leases/{lease['id']}/operations", "POST", json={"kind": KIND, "args": {"secs": 2}})
    assert bad.status_code == 422 and bad.json()["message"].startswith(f"{KIND} takes seconds (") \
        and bad.json()["message"].endswith("; not secs"), bad.text
    refused = cli(env, coordinator, "op", "run", KIND, "sim-board-0", "--arg", "secs=2", check=False)
    assert refused.returncode == 1 and f"device-loop: {KIND} takes seconds (" in refused.stderr, refused.stderr
    unknown = cli(env, coordinator, "op", "run", "reboot", "sim-board-0", "--json", check=False)
    said = json.loads(unknown.stdout)
    assert unknown.returncode == 1 and said["error"] == "no_such_operation" and f"it runs: {KIND}" in said["message"]
    usage = cli(env, coordinator, "op", "run", KIND, "sim-board-0", "--arg", "seconds", check=False)
    assert usage.returncode == 2 and "'seconds' is not NAME=VALUE" in usage.stderr

    # refused by the plugin: a value out of its bounds (the operation fails, saying what to run once fixed)
    failed = cli(env, coordinator, "op", "run", KIND, "sim-board-0", "--arg", "seconds=600", check=False)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "seconds must be a number above 0 and at most 10, not 600" in failed.stderr, failed.stderr
    assert f"run it again: device-loop op run {KIND} sim-board-0 --arg seconds=600" in failed.stderr

    # the console open elsewhere: two readers would split its bytes, so the capture does not begin
    holder = os.open(console, os.O_RDWR | os.O_NOCTTY)
    try:
        busy = json.loads(cli(env, coordinator, "op", "run", KIND, "sim-board-0", "--json", check=False).stdout)
    finally:
        os.close(holder)
    assert busy["error"] == "operation_failed" and f"is open in pid {os.getpid()} (" in busy["message"], busy
    assert "a capture needs it alone" in busy["message"]
    refused_op = coordinator.api(f"/ops/{busy['op']}").json()
    assert refused_op["phase"] == "running" and "resetting" not in refused_op["seconds"], "the board was not reset"
    assert_captured(cli_json_wait(env, coordinator, cli(env, coordinator, "op", "run", KIND, "sim-board-0", "--arg",
                                                        "seconds=1", "--detach").stdout.strip()), 1)
