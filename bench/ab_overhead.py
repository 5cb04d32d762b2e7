"""The A/B runner's overhead per run, beside the bare command run by hand, in one run
(docs/architecture.md, "Jobs and evidence").

A real coordinator and exporter on loopback (single-user), serving a simulated board whose
``run-workload --cost 1`` takes 1 s (no throttling, no cooldown step: a settle has nothing
to wait for) and, where Debian's sshd is installed, ``vm``: this machine's own sshd on a
loopback port, relayed by the ``ssh`` plugin.

For each channel (the board's UART console; ssh):

1. bare: the job's command typed by hand, ``device-loop exec LEASE -- run-workload --cost 1``
   (over ssh, ``-- sleep 1``), timed from start to exit, ``-n`` times;
2. through the runner: an A/B job whose two arms are that same command (``--rounds n``, no
   warmup, settle on), run by this process as its worker (``client/runner.py``): per run,
   the time from one run's start to the next one's (the command, its report, the settle and
   the readings before the next); target <= 1.2x the bare command;
3. what a run adds, each timed on its own: a settle with nothing to wait for, the readings
   at a run's start (one exec round trip), an exec round trip of ``true`` in this process,
   and ``device-loop exec LEASE -- true`` as a process.

Usage: bench/ab_overhead.py [-n 6]
"""
from __future__ import annotations

import argparse
import getpass
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from device_loop.client import Lab
from device_loop.client.runner import Runner
from device_loop.core.device_exec import exec_on_lease
from device_loop.core.ab.fingerprint import readings
from device_loop.core.ab.jobs import JobSpec
from device_loop.core.ports import free_port, port_is_free
from local_lab import lease_ready, local_lab, wait

TARGET = 1.2
SSHD = "/usr/sbin/sshd"
DEVICE_LOOP = str(Path(sys.executable).parent / "device-loop")
BOARD = {"name": "board", "plugin": "sim", "class": "sim-board", "workload_s": 1.0, "noise": 0.0,
         "work_heat": 0}


class Sshd:
    """This machine's sshd in the foreground on a free loopback port, with keys of its own."""

    def __init__(self, folder: Path):
        folder.mkdir()
        for name in ("host_key", "id"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)], check=True)
        self.identity = folder / "id"
        self.host_key = (folder / "host_key.pub").read_text().strip()
        (folder / "authorized_keys").write_text((folder / "id.pub").read_text())
        self.port, self.user = free_port(), getpass.getuser()
        (folder / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {folder / 'host_key'}\n"
            f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPidFile {folder / 'sshd.pid'}\nStrictModes no\n"
            "UsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n")
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(folder / "sshd_config")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait(lambda: self.proc.poll() is not None or not port_is_free("127.0.0.1", self.port), 10, "sshd")
        if self.proc.poll() is not None:
            raise SystemExit("sshd did not start")

    def device(self) -> dict:
        return {"name": "vm", "class": "vm", "resources": [{"plugin": "ssh", "port": self.port, "user": self.user,
                                                             "host_key": self.host_key}]}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def median_s(times: list[float]) -> float:
    return statistics.median(times)


def timed(action, n: int) -> float:
    """The median wall time of ``action()`` over ``n`` calls."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return median_s(times)


def by_hand(env: dict, lease_id: str, command: str) -> None:
    done = subprocess.run([DEVICE_LOOP, "exec", lease_id, "--", *command.split()], env=env, capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"device-loop exec {command}: {done.stderr.decode(errors='replace')}")


def through_the_runner(lab: Lab, env: dict, device: str, command: str, rounds: int) -> list[float]:
    """An A/B job whose arms are both ``command``, run here: the seconds from each run's start
    to the next one's."""
    spec = JobSpec.model_validate({"target": {"device": device}, "ab": {
        "baseline": [command], "patch": [command], "rounds": rounds, "warmup": 0, "settle": True}})
    job = Runner(lab.jobs, base_env=env).run(lab.jobs.submit(spec, claim=True))
    if job.state != "done":
        raise SystemExit(f"the job failed: {job.reason}")
    starts = [r.started_at for r in sorted(job.runs, key=lambda r: r.seq)]
    return [b - a for a, b in zip(starts, starts[1:])]


def channel(lab: Lab, api, env: dict, device: str, workload: str, n: int, identity: str | None) -> dict[str, float]:
    """The figures of one channel: ``workload`` on ``device`` by hand, its parts, and through the runner."""
    lease = lab.lease(lease_ready(api, device)["id"])
    run_env = env | ({"DEVICE_LOOP_SSH_IDENTITY": identity} if identity else {})
    figures = {"bare": timed(lambda: by_hand(run_env, lease.id, workload), n),
               "settle (nothing to wait for)": timed(lambda: lease.settle(timeout=30), n),
               "readings (1 exec round trip)": timed(
                   lambda: readings(lambda c, t: exec_on_lease(lease.data, c, t, identity_file=identity)), n),
               "exec true, in this process": timed(
                   lambda: exec_on_lease(lease.data, "true", 30, identity_file=identity), n),
               "device-loop exec LEASE -- true": timed(lambda: by_hand(run_env, lease.id, "true"), n)}
    lease.release()
    wait(lambda: api.get(f"/devices/{device}").json()["state"] == "idle", 60, f"{device} idle")
    command = f"device-loop exec $DEVICE_LOOP_LEASE -- {workload}"
    if "run-workload" not in workload:  # (it prints its metric; anything else: a metric line of the worker's)
        command += """ && echo '{"metric": "done", "value": 1}'"""
    cycles = through_the_runner(lab, run_env, device, command, n)
    figures["through the runner, a run"] = median_s(cycles)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=6, help="runs of each (default 6)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    folder = Path(tempfile.mkdtemp(prefix="devloop-ab-"))
    sshd = Sshd(folder / "sshd") if shutil.which("ssh") and Path(SSHD).exists() else None
    devices = [BOARD] + ([sshd.device()] if sshd else [])
    results: dict[str, dict[str, float]] = {}
    try:
        with local_lab(devices, heartbeat_s=1.0) as served:
            lab = Lab(served.url, user="bench")
            env = {**served.env, "PATH": f"{Path(DEVICE_LOOP).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
            results["console (UART)"] = channel(lab, served.api, env, "board", "run-workload --cost 1", args.n, None)
            if sshd:
                results["ssh"] = channel(lab, served.api, env, "vm", "sleep 1", args.n, str(sshd.identity))
            lab.api.close()
    finally:
        if sshd:
            sshd.stop()
    load_after = os.getloadavg()
    print(f"A/B runner overhead per run: a 1 s workload, {args.n} runs of each, medians "
          f"({os.cpu_count()} CPUs; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after)")
    for name, figures in results.items():
        bare = figures["bare"]
        print(f"  {name}: {'bare command by hand':<34} {bare * 1000:8.0f} ms  1.00x")
        for what, seconds in figures.items():
            if what != "bare":
                ratio = seconds / bare
                mark = f"  (target <= {TARGET}x: {'met' if ratio <= TARGET else 'NOT met'})" \
                    if what.startswith("through") else ""
                print(f"  {'':{len(name) + 1}} {what:<34} {seconds * 1000:8.0f} ms  {ratio:.2f}x{mark}")
    if sshd is None:
        print("  ssh: not measured (no sshd here: apt-get install openssh-server)")


if __name__ == "__main__":
    main()
