"""exec through a UART console (docs/architecture.md, "Running a command on a device"), in a
lab with tokens (so past the lease gate): a simulated board's shell, and a real POSIX sh on a
socat pty served by ser2net, so that the simulation is never more lenient than the real
thing; a console nobody answers; the CLI's exit status."""
import json
import os
import subprocess
import time

import pytest

from conftest import Coordinator, Exporter, PtyPair, lab_tokens, own_environment, wait_for
from device_loop.client.lab import Lab
from device_loop.core import device_exec
from device_loop.core.device_exec import MAX_COMMAND_BYTES, ExecError, exec_on_lease
from helpers import run_cli, wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]


class RealShell:
    """An interactive ``sh`` on a pty, as a board's serial console: socat makes the pty our
    side opens, and the pty sh has as its terminal (so Ctrl-C is a SIGINT, echo is the tty's)."""

    def __init__(self, folder):
        self.link = folder / "ttyS"
        environment = {"PATH": os.environ["PATH"], "HOME": str(folder), "ENV": "", "PS1": "# "}
        self.proc = subprocess.Popen(["socat", f"PTY,link={self.link},raw,echo=0",
                                      "EXEC:sh -i,pty,stderr,setsid,sigint,ctty"],
                                     env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.link.exists, what="the shell's pty")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(5)


def environment(folder) -> dict:
    """What conftest's ``env`` gives a test (``own_environment``: the run's mark kept, so what it
    starts is looked for at the end of the run), for a lab the tests of this module share."""
    return own_environment(folder)


@pytest.fixture(scope="module")
def console_lab(tmp_path_factory):
    """(alice's Lab, her environment, the coordinator, leases by device): a simulated board ``sb``,
    a real sh ``realsh`` (raw TCP through ser2net) and ``mute``, a pty nobody answers (RFC 2217).
    One lab for the module's tests: each of them leaves the consoles at their prompts."""
    tmp_path = tmp_path_factory.mktemp("console-lab")
    env = environment(tmp_path)
    coordinator = Coordinator(tmp_path, env, extra=())
    tokens, token_file = lab_tokens(env, coordinator, tmp_path, "alice")
    shell, mute = RealShell(tmp_path), PtyPair(tmp_path)
    devices = [{"name": "sb", "plugin": "sim", "class": "sim-board", "workload_s": 0.05},
               {"name": "realsh", "plugin": "uart", "path": str(shell.link), "raw": True},
               {"name": "mute", "plugin": "uart", "path": str(mute.board_side)}]
    exporter = Exporter(tmp_path, env, coordinator.url, devices, token_file=str(token_file))
    lab = Lab(coordinator.url, token=tokens["alice"])
    try:
        for name in ("sb", "realsh", "mute"):
            wait_state(coordinator, name, "idle")
        leases = {name: lab.reserve(name).wait_ready() for name in ("sb", "realsh", "mute")}
        assert all(e["secret"] for lease in leases.values() for e in lease.endpoints), "a lab with tokens gates them"
        yield lab, {**env, "DEVICE_LOOP_TOKEN": tokens["alice"]}, coordinator, leases
    finally:
        lab.api.close()
        exporter.stop()
        shell.stop()
        mute.unplug()
        coordinator.stop()


@pytest.mark.parametrize("device, endless", [("sb", "run-workload --cost 1000"), ("realsh", "sleep 1000")])
def test_exec_on_a_console_gives_output_and_status(console_lab, device, endless):
    lease = console_lab[3][device]
    began = time.monotonic()
    said = lease.exec("echo hello; echo there")
    waited = time.monotonic() - began
    assert (said.stdout, said.stderr, said.status, said.channel) == ("hello\nthere\n", "", 0, "console")
    assert not said.truncated and 0 < said.elapsed_s <= waited, "the time it reports is within the time it took"
    assert lease.exec("false").status == 1
    unknown = lease.exec("frobnicate")
    assert unknown.status == 127 and "frobnicate: not found" in unknown.stdout
    missing = lease.exec("cat /no/such/file")
    assert missing.status == 1 and "No such file or directory" in missing.stdout, "stderr comes with stdout"
    assert lease.exec("echo -n x").stdout == "x", "no newline added, none taken"
    assert lease.exec("echo '#' # a comment").stdout == "#\n", "a comment does not swallow the end marker"
    assert lease.exec("sh -c 'exit 3'").status == 3
    assert lease.exec("exit 4").status == 4, "exit ends the command's own shell, not the console's"
    assert lease.exec("echo 'unclosed").status == 2, "a syntax error is the command's, the console goes on"

    with pytest.raises(ExecError) as timed_out:
        lease.exec(endless, timeout_s=1)
    assert timed_out.value.code == "timeout" and "back at its prompt" in timed_out.value.message
    assert lease.exec("echo still here").stdout == "still here\n", "the console is usable after a timeout"


@pytest.mark.parametrize("device", ["sb", "realsh"])
def test_output_past_max_output_is_cut_and_said_so(console_lab, device):
    lease = console_lab[3][device]
    cut = lease.exec("cat /proc/cpuinfo; cat /proc/cpuinfo", max_output=64)
    assert cut.truncated and cut.status == 0 and 0 < len(cut.stdout.encode()) <= 64
    assert "cut at 64 bytes" in cut.stderr
    assert lease.exec("echo next").stdout == "next\n", "the rest was read to the end marker, and dropped"


def test_commands_a_console_cannot_take_are_refused_before_a_byte_is_sent(console_lab):
    lease = console_lab[3]["sb"]
    for command, code in [("echo " + "x" * MAX_COMMAND_BYTES, "too_large"), ("echo " + "'" * 1100, "too_large"),
                          ("echo a\necho b", "bad_command"), ("   ", "bad_command"), ("echo \0", "bad_command"),
                          ("echo 'a\x03b'", "bad_command"), ("echo a\x15", "bad_command"),  # ^C, ^U: the line's
                          ("echo a\x04", "bad_command")]:
        with pytest.raises(ExecError) as refused:
            lease.exec(command)
        assert refused.value.code == code, command[:40]
    for timeout_s in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ExecError, match="positive"):
            lease.exec("true", timeout_s=timeout_s)


def test_a_console_nobody_answers_is_refused_cleanly(console_lab, monkeypatch):
    monkeypatch.setattr(device_exec, "PROMPT_WAIT_S", 1.0)
    lease = console_lab[3]["mute"]
    assert {e["protocol"] for e in lease.endpoints} == {"rfc2217"}, "through pyserial's RFC 2217, past the gate"
    with pytest.raises(ExecError) as refused:
        lease.exec("uname -a")
    assert refused.value.code == "no_prompt" and "showed no shell prompt within 1s" in refused.value.message


def test_the_cli_exits_with_the_command_s_status(console_lab):
    lab, alice, coordinator, leases = console_lab
    url = coordinator.url
    done = run_cli(alice, url, "exec", "sb", "--", "echo", "hi")
    assert done.stdout == "hi\n" and done.stderr == ""
    assert run_cli(alice, url, "exec", "sb", "--", "false", check=False).returncode == 1
    unknown = run_cli(alice, url, "exec", leases["sb"].id, "--", "frobnicate", check=False)
    assert unknown.returncode == 127 and "frobnicate: not found" in unknown.stdout
    answer = json.loads(run_cli(alice, url, "exec", "sb", "--json", "--", "uname", "-m").stdout)
    assert answer == {"stdout": "riscv64\n", "stderr": "", "status": 0, "channel": "console",
                      "elapsed_s": answer["elapsed_s"], "truncated": False}
    # several arguments reach the command each as given (as docker exec passes them); one is a shell line
    given = run_cli(alice, url, "exec", "realsh", "--", "sh", "-c", "echo hi; exit 3", check=False)
    assert (given.stdout.replace("\r", ""), given.returncode) == ("hi\n", 3), given
    assert run_cli(alice, url, "exec", "realsh", "--", "echo", "$HOME", "a  b").stdout.replace("\r", "") \
        == "$HOME a  b\n"
    line = run_cli(alice, url, "exec", "realsh", "--", "echo one; echo two", check=False)
    assert line.stdout.replace("\r", "") == "one\ntwo\n"
    endless = run_cli(alice, url, "exec", "sb", "--timeout", "1s", "--", "run-workload", "--cost", "1000", check=False)
    assert endless.returncode == 124 and "did not end within 1s" in endless.stderr
    refused = run_cli(alice, url, "exec", "nowhere", "--", "true", check=False)
    assert refused.returncode == 1 and "nowhere" in refused.stderr
    mute = run_cli(alice, url, "exec", "mute", "--", "true", check=False)
    assert mute.returncode == 75 and "no shell prompt" in mute.stderr, "the lab failed it (docs: Lab failures)"


def test_a_lease_without_a_channel_is_refused():
    for lease, says in [({"device": "b", "ready": False, "reason": "starting"}, "not ready: starting"),
                        ({"device": "b", "ready": True, "endpoints": [{"role": "rfb", "host": "h", "port": 1}]},
                         "no adb, ssh or console endpoint")]:
        with pytest.raises(ExecError) as refused:
            exec_on_lease(lease, "true")
        assert refused.value.code == "no_channel" and says in refused.value.message


def test_a_sim_board_s_fingerprint_through_its_console(console_lab):
    lab, alice, coordinator, leases = console_lab
    found = leases["sb"].fingerprint()
    assert (found.device, found.device_class, found.channel) == ("sb", "sim-board", "console")
    assert found.kernel.startswith("Linux sb 6.1.0-sim #1 SMP") and found.kernel.endswith("riscv64 GNU/Linux")
    assert found.cpu_model == "sim,rv64-core" and {"i", "m", "a", "f", "d", "c", "zba", "zbb"} <= set(found.isa)
    assert (found.cores, found.online, found.memory_kb) == (4, "0-3", 2048 * 1024)
    (policy,) = found.cpufreq
    assert policy == {"policy": "policy0", "governor": "schedutil", "cur_khz": policy["cur_khz"],
                      "min_khz": "600000", "max_khz": "1800000"}
    assert 600000 <= int(policy["cur_khz"]) <= 1800000, "(lower once the module's tests have warmed the board)"
    assert list(found.thermal) == ["cpu-thermal"] and 35 < found.thermal["cpu-thermal"] < 80
    assert found.extra == {"sim.seed": "0", "sim.workload_s": "0.05"}, "the plugin's facts"
    assert found.emulated, "a sim board's resources say it is simulated (its fidelity): not for timing"
    said = json.loads(run_cli(alice, coordinator.url, "fingerprint", "sb", "--json").stdout)
    assert said["isa"] == found.isa and said["channel"] == "console"
    text = run_cli(alice, coordinator.url, "fingerprint", "sb").stdout
    assert "reached over console" in text and "zba" in text and "policy0" in text and "not for timing" in text
