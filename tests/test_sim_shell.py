"""The simulated board's shell (plugins/sim/shell.py): what exec's wrapper and a fingerprint's
reads need, the /proc and /sys files as the kernel writes them for each arch, and
run-workload: its length from its cost, the temperature and a seeded spread, the heat it
puts in, Ctrl-C; and on the model's clock, that ABAB with a cooldown recovers a 5 % change
where AABB without one gets it wrong, on the same seed (plugins/sim/workload.py)."""
import json
import statistics
import threading
import time

import pytest
import serial

from conftest import wait_for
from device_loop.core.ab import fingerprint
from device_loop.plugins.sim import SimConfig
from device_loop.plugins.sim.board import SimBoard
from device_loop.plugins.sim.facts import BoardFacts
from device_loop.plugins.sim.shell import Shell
from device_loop.plugins.sim.thermal import Thermal, throttle
from device_loop.plugins.sim.workload import Workload, WorkloadModel
from test_sim_board import read_until

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def shell(facts=None, clock=None, **model) -> Shell:
    thermal = Thermal(40.0, 4.0, clock=clock or Clock(), work_heat_c_per_s=50.0)
    return Shell(facts or BoardFacts("b0"), thermal, Workload(WorkloadModel(**model), thermal), lambda: "BANNER\n")


def run(sh: Shell, line: str) -> tuple[str, int]:
    said: list[str] = []
    status = sh.run(line, said.append, threading.Event())
    return "".join(said), status


def test_status_sequences_quotes_and_unknown_commands():
    sh = shell()
    assert run(sh, "false; echo $?") == ("1\n", 0)
    assert run(sh, "frobnicate --now") == ("sh: frobnicate: not found\n", 127)
    assert run(sh, "echo $?") == ("127\n", 0), "an unknown command is 127, as in a shell"
    assert run(sh, "true && echo yes || echo no; false && echo never; echo \"it was $?\"") == ("yes\nit was 1\n", 0)
    assert run(sh, "echo 'DLX'abc_S 'a  b' \"c\\\"d\" e\\ f") == ("DLXabc_S a  b c\"d e f\n", 0)
    assert run(sh, "echo -n x") == ("x", 0)
    assert run(sh, "echo a # b; echo c") == ("a\n", 0)
    assert run(sh, "sh -c 'echo $?; exit 7'; echo $?") == ("0\n7\n", 0), "a shell of its own starts at 0"
    assert run(sh, "sh -c 'false'") == ("", 1)
    assert run(sh, "cat /nope 2>/dev/null; echo $?") == ("1\n", 0)
    assert run(sh, "echo hidden >/dev/null 2>&1") == ("", 0)
    assert run(sh, "echo out >&2 2>/dev/null")[0] == "out\n", "redirections apply left to right"
    for line, said in [("echo 'open", "Unterminated quoted string"), ("echo a | wc", "has no '|'"),
                       ("echo $(id)", "has no '$'"), ("&& true", '"&&" unexpected'), ("true &&", "end of file"),
                       ("echo > /etc/x", "Read-only file system")]:
        output, status = run(sh, line)
        assert status == 2 and said in output, line
    assert run(sh, "exit 3") == ("sh: exit: the console's own shell stays (a simulated board has no login to go "
                                 "back to)\n", 1)


def test_uname_nproc_and_cat_of_the_files_a_fingerprint_reads():
    sh = shell(BoardFacts("b0", arch="aarch64", isa=("fp", "asimd", "sve", "sve2"), cores=8, memory_mb=4096,
                          governor="performance", cpu_part="0xd49"))
    assert run(sh, "uname -a")[0] == ("Linux b0 6.1.0-sim #1 SMP PREEMPT Thu Jan  1 00:00:00 UTC 2026 aarch64 "
                                      "GNU/Linux\n")
    assert run(sh, "uname -sm") == ("Linux aarch64\n", 0)
    assert run(sh, "uname -x")[1] == 1
    assert run(sh, "nproc") == ("8\n", 0)
    assert run(sh, "cat /sys/devices/system/cpu/online") == ("0-7\n", 0)
    assert run(sh, "cat /proc/meminfo")[0].startswith("MemTotal:        4194304 kB\n")
    assert run(sh, "cat /sys/class/thermal/thermal_zone0/temp /sys/class/thermal/thermal_zone0/type") == \
        ("40000\ncpu-thermal\n", 0)
    policy = "/sys/devices/system/cpu/cpufreq/policy0/scaling_"
    assert run(sh, f"cat {policy}governor {policy}min_freq {policy}max_freq {policy}cur_freq") == \
        ("performance\n600000\n1800000\n1800000\n", 0)
    assert run(sh, "cat /sys/devices/system/cpu/cpufreq/policy*/scaling_governor") == ("performance\n", 0), "a glob"
    assert run(sh, "cat /proc/nothing /proc/loadavg") == ("cat: /proc/nothing: No such file or directory\n"
                                                          "0.08 0.03 0.01 1/96 411\n", 1)
    blocks = fingerprint.cpuinfo_blocks(run(sh, "cat /proc/cpuinfo")[0])
    assert len(blocks) == 8 and blocks[0]["features"] == "fp asimd sve sve2" and blocks[0]["cpu part"] == "0xd49"
    assert fingerprint.parse_cpu_model(blocks) == "Neoverse-N2"


@pytest.mark.parametrize("arch, isa, line, model", [
    ("riscv64", ["i", "m", "a", "f", "d", "c", "v", "zba", "zvbb"], "isa\t\t: rv64imafdcv_zba_zvbb", "sim,rv64-core"),
    ("x86_64", ["sse4_2", "avx", "avx2", "fma"], "flags\t\t: sse4_2 avx avx2 fma", "Simulated x86-64 CPU @ 2.00GHz"),
    ("aarch64", None, "Features\t: fp asimd evtstrm aes", "Cortex-A76"),
])
def test_cpuinfo_is_written_the_way_the_kernel_writes_it_for_each_arch(arch, isa, line, model):
    config = SimConfig.model_validate({"arch": arch, **({"isa": isa} if isa else {}), "cores": 2})
    sh = shell(config.facts("b0"))
    said = run(sh, "cat /proc/cpuinfo")[0]
    assert line in said and said.count("processor\t: ") == 2
    blocks = fingerprint.cpuinfo_blocks(said)
    assert fingerprint.parse_cpu_model(blocks) == model
    if isa:
        assert set(isa) <= set(fingerprint.parse_isa(blocks))


def test_the_config_refuses_what_a_board_cannot_be():
    for bad in [{"arch": "mips"}, {"isa": ["AVX2"]}, {"cores": 0}, {"min_mhz": 2000, "max_mhz": 1000},
                {"noise": 0.9}, {"workload_s": "0s"}, {"throttle_above": "hot"}, {"seed": -1}, {"cpu_part": "d0b"}]:
        with pytest.raises(ValueError):
            SimConfig.model_validate(bad)
    assert SimConfig.model_validate({"throttle_above": "55C", "tau": "8s"}).throttle_above == 55.0


def test_run_workload_is_its_cost_times_the_throttle_and_a_seeded_spread():
    clock = Clock()
    sh = shell(clock=clock, seconds=0.1, noise=0.0)
    lengths = []
    for cost in (1.0, 0.5):
        before = sh.thermal.read()
        seconds = sh.workload.start(cost)
        clock.now += seconds
        lengths.append(seconds)
        assert sh.thermal.read() - before == pytest.approx(50 * seconds, rel=0.05), "50 °C a second of work"
    assert lengths == [pytest.approx(0.1), pytest.approx(0.05)]
    assert throttle(50.0) == 1.0 and throttle(60.0) == pytest.approx(1.2) and throttle(65.0, 60.0, 0.02) == 1.1

    def lengths_of(seed):
        clock = Clock()
        sh = shell(clock=clock, seconds=0.1, noise=0.01, seed=seed)
        return [sh.workload.start(1.0) for _ in range(5)]
    assert lengths_of(7) == lengths_of(7) != lengths_of(8), "the same seed, the same spread"
    assert all(0.097 <= s <= 0.103 for s in lengths_of(7))


def test_a_hot_board_works_slower_and_says_so_in_its_frequency():
    clock = Clock()
    sh = shell(clock=clock, seconds=0.1, noise=0.0, throttle_above_c=50.0)
    sh.thermal.stress(10)
    clock.now += 10  # some 72 °C
    hot = sh.thermal.read()
    assert sh.workload.start(1.0) == pytest.approx(0.1 * (1 + 0.02 * (hot - 50)))
    cur = int(run(sh, "cat /sys/devices/system/cpu/cpufreq/policy0/scaling_cur_freq")[0])
    assert cur == round(1_800_000 / (1 + 0.02 * (hot - 50))), "the frequency drops as the work slows"


def test_run_workload_prints_its_metric_and_ctrl_c_interrupts_it(tmp_path):
    board = SimBoard("jupiter", tmp_path / "jupiter", facts=BoardFacts("jupiter"),
                     workload=WorkloadModel(seconds=0.05, noise=0.0))
    try:
        started = time.monotonic()
        said = board.answer("run-workload --cost 2")
        assert time.monotonic() - started >= 0.1, "it really takes that long"
        line = said.split("\r\n")[0]
        assert json.loads(line) == {"metric": "workload_ms", "value": pytest.approx(100, abs=0.5), "unit": "ms"}
        assert board.answer("run-workload --cost 0").startswith("run-workload: usage")
        assert board.answer("run-workload --cost=nan").startswith("run-workload: usage")
        with serial.Serial(str(board.link), 115200, timeout=0.1) as port:
            port.reset_input_buffer()
            port.write(b"run-workload --cost 1000; echo never\r")
            read_until(port, b"--cost 1000; echo never\r\n")
            port.write(b"uname -m\r")  # typed while it runs: it waits its turn, then Ctrl-C drops it
            # (the line is echoed as it is typed, before the work begins: its heat follows at once)
            wait_for(board.thermal.working, what="the workload running")
            port.write(b"\x03")
            said = read_until(port, b"jupiter:~# ")
            assert said == b"^C\r\njupiter:~# ", said
            assert not board.thermal.working(), "the work (and its heat) stopped with it"
            port.write(b"echo $?\r")
            assert read_until(port, b"jupiter:~# ").endswith(b"echo $?\r\n130\r\njupiter:~# ")
    finally:
        board.power_off()


def test_typed_ahead_lines_run_once_the_job_ends(tmp_path):
    board = SimBoard("jupiter", tmp_path / "jupiter", workload=WorkloadModel(seconds=0.2, noise=0.0))
    try:
        with serial.Serial(str(board.link), 115200, timeout=0.1) as port:
            port.reset_input_buffer()
            port.write(b"run-workload\recho after\r")
            said = read_until(port, b"after\r\njupiter:~# ")
            assert b'"workload_ms"' in said and said.index(b"workload_ms") < said.index(b"echo after")
    finally:
        board.power_off()


def play(order: str, cooldown_below: float | None, gap_s: float = 0.5, rounds: int = 6) -> tuple[float, list]:
    """An A/B pair on the model's clock (B at --cost 0.95): B/A of the medians, and each run's
    start temperature. With ``cooldown_below``, each run waits until the board is below it."""
    clock = Clock()
    thermal = Thermal(40.0, 8.0, clock=clock, work_heat_c_per_s=50.0)
    workload = Workload(WorkloadModel(seconds=0.1, throttle_above_c=55.0, noise=0.01, seed=1), thermal)
    arms = ["A", "B"] * (rounds + 1) if order == "abab" else ["A", "B"] + ["A"] * rounds + ["B"] * rounds
    lengths: dict[str, list[float]] = {"A": [], "B": []}
    temperatures = []
    for n, arm in enumerate(arms):
        while cooldown_below is not None and thermal.read() >= cooldown_below:
            clock.now += 0.1
        temperatures.append(thermal.read())
        seconds = workload.start(0.95 if arm == "B" else 1.0)
        clock.now += seconds + gap_s
        if n >= 2:  # (the warmup pair)
            lengths[arm].append(seconds)
    return statistics.median(lengths["B"]) / statistics.median(lengths["A"]), temperatures


def test_abab_with_cooldown_recovers_5_percent_where_aabb_without_gets_it_wrong():
    right, cool = play("abab", cooldown_below=53.0)
    assert right == pytest.approx(0.95, abs=0.01) and max(cool) < 55, "every run starts below the knee"
    for gap_s in (0.5, 1.5):
        wrong, hot = play("aabb", cooldown_below=None, gap_s=gap_s)
        assert wrong > 1.0, f"B, truly 5 % cheaper, comes out slower {gap_s}s apart"
        assert max(hot) > 55 and hot[-1] > hot[2], "the board heated run after run"


def test_what_a_hostile_line_can_do_is_bounded(tmp_path):
    sh = shell()
    nested = "true"
    for _ in range(12):
        nested = "sh -c " + "'" + nested.replace("'", "'\\''") + "'"
    said, status = run(sh, nested)
    assert status == 2 and "too deeply nested" in said
    assert run(sh, "sleep 1e9")[1] == 1 and run(sh, "sleep -1")[1] == 1 and run(sh, "sleep inf")[1] == 1
    assert run(sh, "run-workload --cost 1e7")[1] == 2 and run(sh, "run-workload --cost inf")[1] == 2
    board = SimBoard("jupiter", tmp_path / "jupiter")
    try:
        with serial.Serial(str(board.link), 115200, timeout=0.1) as port:
            port.reset_input_buffer()
            port.write(b"echo " + b"x" * 5000 + b"\r")
            said = read_until(port, b"jupiter:~# ", timeout=5)
            assert said.count(b"x") == 2 * (4095 - len(b"echo ")), "a line is 4095 bytes, as a tty's: the rest dropped"
    finally:
        board.power_off()
