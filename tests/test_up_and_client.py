"""`device-loop up` as a user runs it, and the Python client library against it."""
import hashlib
import json
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest

from conftest import SRC, wait_for
from device_loop.client import Lab
from device_loop.core.ports import free_port
from helpers import pid_alive, port_open, recorded_pids, run_cli, uart_exchange

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]
# the command pip installed beside this interpreter, as a user runs it (whichever environment runs the tests)
DEVICE_LOOP = shutil.which("device-loop", path=str(Path(sys.executable).parent)) or shutil.which("device-loop")
SCREENS = shutil.which("Xvfb") is not None  # then `up` gives each simulated board a screen (./lab test installs it)


@pytest.fixture
def lab(tmp_path, env):
    """`device-loop up` with an extra board from --config; yields (url, data dir, process)."""
    port = free_port()
    extra = tmp_path / "extra.toml"
    extra.write_text('[[devices]]\nname = "sim-extra"\nplugin = "sim"\nclass = "sim-board"\n')
    data_dir = tmp_path / "lab"
    log = open(tmp_path / "up.log", "w+")
    here = tmp_path / "somewhere"  # where the user starts it: a script of theirs must not stand in for a library
    here.mkdir()
    for module in ("cv2", "mcp", "serial"):
        (here / f"{module}.py").write_text(f"raise SystemExit('the {module}.py of the folder up was started in')\n")
    assert DEVICE_LOOP, f"no device-loop command beside {sys.executable}: install the project (pip install -e .)"
    proc = subprocess.Popen([DEVICE_LOOP, "up", "--data-dir", str(data_dir),
                             "--port", str(port), "--config", str(extra), "--no-vms"],  # (VMs: test_up_vms.py)
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=here)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: "Ctrl-C stops the lab" in (tmp_path / "up.log").read_text() or proc.poll() is not None,
             what="lab up")
    assert proc.poll() is None, (tmp_path / "up.log").read_text()
    yield url, data_dir, proc
    if proc.poll() is None:
        proc.kill()  # the harshest end: its children must still go (they die with their parent)
        proc.wait()
    wait_for(lambda: not any(pid_alive(p) for p in recorded_pids(data_dir / "up")), what="lab children gone")


def test_up_serves_sim_boards_and_stops_cleanly_on_ctrl_c(lab, env, tmp_path):
    url, data_dir, proc = lab
    wait_for(lambda: {"sim-board-0", "sim-board-1", "sim-extra"} <= {
        line.split()[0] for line in run_cli(env, url, "ls").stdout.splitlines()[1:] if "idle" in line},
        what="three idle boards")
    told = run_cli({**env, "DEVICE_LOOP_TOKEN": "dl_from-another-lab"}, url, "whoami")
    assert told.stderr.count("ignores tokens") == 1 and "device-loop up --tokens" in told.stderr, told.stderr
    out = run_cli(env, url, "reserve", "sim-extra", "--ttl", "30m", "--wait").stdout
    assert "active" in out and "uart" in out
    port = int(out.split("127.0.0.1:")[1].split()[0])
    uart_exchange("127.0.0.1", port, b"hostname\r", b"sim-extra\r\n")
    assert recorded_pids(data_dir / "exporter") == {}, "a sim board's console is a thread of the exporter"
    children = recorded_pids(data_dir / "up")
    screens = {"xvfb-sim-board-0", "xvfb-sim-board-1"} if SCREENS else set()
    assert {r["name"] for r in children.values()} == {"coordinator", "exporter"} | screens
    if SCREENS:
        lease = json.loads(run_cli(env, url, "reserve", "sim-board-0", "--wait", "--json").stdout)
        screen = {e["kind"]: e for e in lease["endpoints"]}
        assert {"vnc", "vnc-web"} <= screen.keys()
        with socket.create_connection((screen["vnc"]["host"], screen["vnc"]["port"]), timeout=10) as rfb:
            rfb.settimeout(10)
            assert rfb.recv(12).startswith(b"RFB 003.0"), "x11vnc serves the board's display"

    second = subprocess.run([sys.executable, "-m", "device_loop.cli", "up", "--data-dir", str(data_dir),
                             "--port", str(free_port())], env=env, capture_output=True, text=True, timeout=30)
    assert second.returncode == 1 and "already running" in second.stderr
    assert all(pid_alive(pid) for pid in children), "a second 'up' broke the running lab"

    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 0
    assert "lab stopped" in (tmp_path / "up.log").read_text()
    assert not any(pid_alive(pid) for pid in children), "something outlived the lab"
    assert not port_open("127.0.0.1", port)
    assert recorded_pids(data_dir / "exporter") == {} and recorded_pids(data_dir / "up") == {}


def test_client_library_waits_and_releases_even_on_error(lab):
    url, _, _ = lab
    lab_client = Lab(url, user="carol")
    wait_for(lambda: any(d["name"] == "sim-board-1" and d["state"] == "idle" for d in lab_client.devices()),
             what="sim-board-1 idle")
    with pytest.raises(RuntimeError, match="test failure"):
        with lab_client.reserve("sim-board-1", ttl="10m") as lease:
            assert lease.state == "active"
            host, port = lease.endpoint("uart")
            uart_exchange(host, port, b"uname\r", b"Linux sim-board-1")
            raise RuntimeError("test failure")
    assert lease.state == "released"
    assert lab_client.lease(lease.id).state == "released"
    assert lab_client.my_leases() == []


def test_the_demo_boards_flash_and_recover_without_hardware(lab, env):
    url, data_dir, _ = lab
    lab_client = Lab(url, user="carol")
    wait_for(lambda: any(i["name"] == "sim-firmware-1.0" for i in lab_client.api.get("/images")),
             what="the demo firmware in the registry")
    firmware = next(i for i in lab_client.api.get("/images") if i["name"] == "sim-firmware-1.0")
    assert firmware["known_good_for"] == ["class:sim-board"]
    target = data_dir / "flash" / "sim-board-0.img"
    target.write_bytes(b"a broken build")
    with lab_client.reserve("sim-board-0", ttl="10m") as lease:
        done = lease.flash("sim-firmware-1.0")
        assert done.state == "done" and "verified by read-back" in done.message
        assert hashlib.sha256(target.read_bytes()).hexdigest() == firmware["sha256"]
        target.write_bytes(b"broken again")
        camera = next(e for e in lease.endpoints if e["kind"] == "video")
        assert httpx2.get(camera["url"] + "snapshot.jpg", timeout=10).content.startswith(b"\xff\xd8")
        recovered = run_cli(env, url, "--user", "carol", "recover", "sim-board-0").stdout
        assert "recover of sim-board-0 with sim-firmware-1.0" in recovered and ": done" in recovered
        assert hashlib.sha256(target.read_bytes()).hexdigest() == firmware["sha256"]


def test_up_on_a_taken_port_starts_nothing(tmp_path, env):
    with socket.create_server(("127.0.0.1", 0)) as taken:  # another lab's coordinator, say
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "device_loop.cli", "up", "--data-dir", str(tmp_path / "lab"),
                                 "--port", str(port)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and f"port {port} is taken" in result.stderr
    assert recorded_pids(tmp_path / "lab" / "up") == {} and not (tmp_path / "lab" / "exporter.toml").exists()


def test_lab_up_installs_only_when_the_project_changed(env):
    if not (SRC / ".venv" / ".installed-test").exists():
        pytest.skip("the suite was not started with ./lab test")
    if (SRC / ".venv").is_symlink():  # ./lab up here would install this checkout into another's venv
        pytest.skip("this checkout's .venv is another's (a link)")
    result = subprocess.run([str(SRC / "lab"), "up", "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "Start a local lab" in result.stdout  # (installs if pyproject.toml changed)
    result = subprocess.run([str(SRC / "lab"), "up", "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert "installing" not in result.stderr and "Editable" not in result.stderr, result.stderr


def test_up_refuses_what_the_exporter_refuses_and_starts_nothing(tmp_path, env):
    typo = tmp_path / "jupiter.toml"
    typo.write_text('[[device]]\nname = "jupiter"\nclass = "riscv-sbc"\nplugin = "sim"\n')
    said = [subprocess.run([sys.executable, "-m", "device_loop.cli", *args, "--config", str(typo)], env=env,
                           capture_output=True, text=True, timeout=30)
            for args in (["up", "--data-dir", str(tmp_path / "lab"), "--port", str(free_port())], ["exporter"])]
    assert [s.returncode for s in said] == [1, 1]
    assert said[0].stderr == said[1].stderr == (f"Error: {typo} is not a valid exporter config:\n"
                                                "  device: an exporter config has no [[device]]; did you mean "
                                                "[[devices]]?\n")
    assert recorded_pids(tmp_path / "lab" / "up") == {} and not (tmp_path / "lab" / "exporter.toml").exists()


def test_up_without_xvfb_serves_the_boards_without_screens(tmp_path, env):
    port, log = free_port(), tmp_path / "up.log"
    bare = tmp_path / "bin"  # a PATH where no Xvfb, x11vnc or websockify is found
    bare.mkdir()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "device_loop.cli", "up", "--data-dir", str(tmp_path / "lab"),
                                 "--port", str(port)], env={**env, "PATH": str(bare)}, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "Ctrl-C stops the lab" in log.read_text() or proc.poll() is not None, what="lab up")
        assert "  screens      none (Xvfb, x11vnc, websockify not installed" in log.read_text(), log.read_text()
        lease = json.loads(run_cli(env, f"http://127.0.0.1:{port}", "reserve", "sim-board-0", "--wait",
                                   "--json").stdout)
        assert {e["kind"] for e in lease["endpoints"]} == {"uart", "video"}
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
