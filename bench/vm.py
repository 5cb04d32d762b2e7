"""VM leases beside QEMU started by hand, each figure next to its floor measured in the same run.

A real coordinator (SQLite) and exporter on loopback serving x86_64 VM slots of the qemu
plugin, booting the guest ``plugins/qemu/guest.py`` builds (Debian's cloud kernel, a
busybox initramfs), under TCG where KVM does not work:

- reserve -> the console's prompt over N leases, p50 / p99: from a warm slot (one VM booted
  ahead; each lease begins once the pool booted the next) and from a cold slot (warm 0: the
  boot is the lease's); floor: ``qemu-system-x86_64`` started by hand with the same kernel,
  initramfs, machine, CPU and memory, spawn -> prompt on its serial port, in turns with the
  cold leases (the machine's load is then the same for both).
- four leases at once (``needs = "any"`` where the coordinator takes it, else by class) on a
  slot of four: all served, and the time until all four consoles showed their prompt.
"""
from __future__ import annotations

import argparse
import os
import re
import select
import shutil
import socket
import subprocess
import threading
import time
from importlib.metadata import entry_points
from pathlib import Path

import httpx2

from device_loop.core.ports import free_port
from device_loop.plugins.qemu.guest import ARCHES, PROMPT_PATTERN, GuestError, build_guest
from local_lab import local_lab, ms, pct, wait

ARCH = "x86_64"
MEMORY_MIB = 256
CPU, MACHINE = "max", "pc"  # the qemu plugin's defaults for x86_64
BOOT_WAIT_S = 120.0
WARM, COLD, MANY = "vm-warm", "vm-cold", "vm-many"
AT_ONCE = 4


def default_cache() -> Path:
    return Path(os.environ.get("DEVICE_LOOP_GUEST_CACHE") or
                Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "device-loop" / "guests")


def slots() -> list[dict]:
    common = {"plugin": "qemu", "arch": ARCH, "cpu": CPU, "machine": MACHINE, "memory": MEMORY_MIB,
              "kernel": "vmlinuz", "initrd": "initrd.cpio.gz", "append": "quiet panic=-1"}
    return [{"name": WARM, "class": "vm-warm", "warm": 1, **common},
            {"name": COLD, "class": "vm-cold", "warm": 0, **common},
            {"name": MANY, "class": "vm-many", "warm": 0, "instances": AT_ONCE, **common}]


def prepared(guest):
    """What ``local_lab`` runs first: the guest's files in the exporter's state folder, and the
    qemu plugin's entry point where the virtualenv was installed before the plugin existed."""
    def prepare(folder: Path, env: dict) -> None:
        images = folder / "exporter" / "qemu" / "images"
        images.mkdir(parents=True)
        os.link(guest.kernel, images / "vmlinuz")
        os.link(guest.initrd, images / "initrd.cpio.gz")
        if not any(e.name == "qemu" for e in entry_points(group="device_loop")):
            info = folder / "entry" / "devloop_qemu_bench-0.dist-info"
            info.mkdir(parents=True)
            (info / "METADATA").write_text("Metadata-Version: 2.1\nName: devloop-qemu-bench\nVersion: 0\n")
            (info / "entry_points.txt").write_text("[device_loop]\nqemu = device_loop.plugins.qemu:QemuPlugin\n")
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder / "entry"), env.get("PYTHONPATH")]))
        env.pop("DEVICE_LOOP_LOAD_PLUGINS", None)
    return prepare


def await_prompt(sock: socket.socket, deadline: float) -> None:
    """Read ``sock`` until the guest's prompt ends what it showed (Enter each quiet second)."""
    seen = b""
    sock.sendall(b"\r")
    while not PROMPT_PATTERN.search(seen.decode(errors="replace")):
        left = deadline - time.monotonic()
        if left <= 0:
            raise SystemExit(f"no prompt: {seen[-300:]!r}")
        if select.select([sock], [], [], min(1.0, left))[0]:
            data = sock.recv(4096)
            if not data:
                raise SystemExit("the console hung up")
            seen = (seen + data)[-4096:]
        else:
            sock.sendall(b"\r")


def lease_to_prompt(api: httpx2.Client, body: dict) -> tuple[float, dict]:
    """(seconds from the reserve to the console's prompt, the lease with ``ready_s``: from the
    reserve to the lease ready)."""
    started = time.perf_counter()
    lease = api.post("/leases", json={"ttl_s": 600, **body}).json()
    if "id" not in lease:
        raise SystemExit(f"reserve refused: {lease}")
    while not lease["ready"]:
        lease = api.get(f"/leases/{lease['id']}", params={"wait": 10, "unless": "pending"}).json()
        if lease["state"] not in ("pending", "active"):
            raise SystemExit(f"lease ended: {lease['reason']}")
    lease["ready_s"] = time.perf_counter() - started
    console = next(e for e in lease["endpoints"] if e.get("role") == "console" and e.get("protocol") == "raw")
    with socket.create_connection((console["host"], console["port"]), timeout=10) as sock:
        await_prompt(sock, time.monotonic() + BOOT_WAIT_S)
    return time.perf_counter() - started, lease


def pool(url: str, slot: str) -> dict[str, float]:
    """``slot``'s pool as the exporter last reported it (the qemu plugin's ``devloop_metrics``,
    ``slot_NAME_*``): ``ready``, ``boots``..."""
    prefix = f"device_loop_plugin_slot_{re.sub(r'[^a-z0-9]+', '_', slot)}_"
    said = {}
    for line in httpx2.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(prefix) and "{" in line:
            said[line[len(prefix):line.index("{")]] = float(line.rsplit(" ", 1)[1])
    return said


def leases(lab, device: str, rounds: int, warm: bool) -> tuple[list[float], list[float]]:
    """(reserve -> prompt, reserve -> lease ready) of ``rounds`` leases of ``device``, one after another."""
    times, ready = [], []
    boots = 0.0
    for _ in range(rounds):
        if warm:  # a VM booted after the last lease took one (a report from before that take says ready too)
            counts = wait(lambda after=boots: (c := pool(lab.url, device)) and c.get("ready", 0) >= 1
                          and c.get("boots", 0) > after and c, BOOT_WAIT_S, f"{device}'s pool warm")
            boots = counts["boots"]
        seconds, lease = lease_to_prompt(lab.api, {"device": device})
        times.append(seconds)
        ready.append(lease["ready_s"])
        lab.api.post(f"/leases/{lease['id']}/release")
        wait(lambda: lab.api.get(f"/devices/{device}").json()["state"] == "idle", BOOT_WAIT_S, f"{device} idle")
    return times, ready


def cold_beside_hand(lab, guest, rounds: int) -> tuple[list[float], list[float]]:
    """(reserve -> prompt of the cold slot, QEMU by hand: spawn -> prompt), taken in turns (ABBA)
    so that both see the same load of the machine."""
    cold: list[float] = []
    hand: list[float] = []
    for n in range(rounds):
        for which in (("cold", "hand") if n % 2 == 0 else ("hand", "cold")):
            if which == "cold":
                cold += leases(lab, COLD, 1, warm=False)[0]
            else:
                hand += by_hand(guest, 1)
    return cold, hand


def by_hand(guest, rounds: int) -> list[float]:
    """qemu-system-x86_64 started by hand: spawn -> prompt on its serial port (a TCP socket)."""
    times = []
    for _ in range(rounds):
        port = free_port()
        argv = [ARCHES[ARCH].qemu, "-accel", "tcg", "-machine", MACHINE, "-cpu", CPU, "-m", str(MEMORY_MIB),
                "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none",
                "-chardev", f"socket,id=console,host=127.0.0.1,port={port},server=on,wait=off",
                "-serial", "chardev:console", "-kernel", str(guest.kernel), "-initrd", str(guest.initrd),
                "-append", guest.append]
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + BOOT_WAIT_S
            sock = wait(lambda port=port: _connect(port), BOOT_WAIT_S, "QEMU's serial port")
            with sock:
                await_prompt(sock, deadline)
            times.append(time.perf_counter() - started)
        finally:
            proc.kill()
            proc.wait()
    return times


def _connect(port: int) -> socket.socket | None:
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=1)
    except OSError:
        return None


def at_once(lab) -> tuple[list[float], float, str]:
    """Four leases asked at the same moment: (each one's reserve -> prompt, the time until the
    last prompt, how they were asked)."""
    asked, how = {"class": "vm-many", "needs": "any"}, 'needs = "any", class vm-many'
    probe = lab.api.post("/leases", json={"device": "no-such-device", "needs": "any"})  # (a 404 if needs is known)
    if probe.status_code == 422 and "needs" in probe.text:
        asked, how = {"class": "vm-many"}, "by class (this coordinator takes no needs)"
    times: list[float] = []
    got: list[dict] = []
    gate = threading.Barrier(AT_ONCE)

    def one() -> None:
        with httpx2.Client(base_url=f"{lab.url}/api/v1", headers={"X-Device-Loop-User": "bench"}, timeout=30) as api:
            gate.wait()
            seconds, lease = lease_to_prompt(api, asked)
            times.append(seconds)
            got.append(lease)

    started = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(AT_ONCE)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = time.perf_counter() - started
    if len(got) != AT_ONCE or len({lease["device"] for lease in got}) != AT_ONCE:
        raise SystemExit(f"not all {AT_ONCE} were served on devices of their own: {[g['device'] for g in got]}")
    for lease in got:
        lab.api.post(f"/leases/{lease['id']}/release")
    wait(lambda: all(lab.api.get(f"/devices/{lease['device']}").json()["state"] == "idle" for lease in got),
         BOOT_WAIT_S, "the four idle again (their VMs ended)")
    return times, everything, how


def row(name: str, values: list[float], floor: float | None = None) -> str:
    ratio = f"  ({pct(values, 50) / floor:.2f}x the floor's p50)" if floor else ""
    return f"  {name:<42} p50 {ms(pct(values, 50))}  p99 {ms(pct(values, 99))}{ratio}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10, help="leases of each slot, and hand boots (default 10)")
    parser.add_argument("--cache", type=Path, default=default_cache(),
                        help="where the guest's Debian packages are kept (default $DEVICE_LOOP_GUEST_CACHE, else "
                             "~/.cache/device-loop/guests)")
    args = parser.parse_args()
    missing = [program for program in (ARCHES[ARCH].qemu, "qemu-img") if shutil.which(program) is None]
    if missing:
        print(f"skipped: {', '.join(missing)} not installed (Debian: apt-get install qemu-system-x86 qemu-utils)")
        return
    try:
        guest = build_guest(ARCH, args.cache)
    except GuestError as exc:
        raise SystemExit(f"no guest to boot: {exc}") from None
    devices = {WARM, COLD, *(f"{MANY}-{n}" for n in range(AT_ONCE))}
    with local_lab(slots(), heartbeat_s=1.0, prepare=prepared(guest), idle_s=BOOT_WAIT_S, names=devices) as lab:
        warm, warm_ready = leases(lab, WARM, args.n, warm=True)
        cold, hand = cold_beside_hand(lab, guest, args.n)
        many, everything, how = at_once(lab)
    floor = pct(hand, 50)
    print(f"VM leases, {ARCH} under TCG ({os.cpu_count()} cores), {args.n} of each:")
    print(row("QEMU by hand, spawn -> prompt (floor)", hand))
    print(row("reserve -> prompt, cold slot", cold, floor))
    print(row("reserve -> prompt, warm slot", warm))
    print(row("  of which reserve -> lease ready", warm_ready))
    print(f"  {AT_ONCE} leases at once ({how}): all served; the last prompt after {ms(everything)}; "
          f"each: {', '.join(ms(t).strip() for t in sorted(many))}")


if __name__ == "__main__":
    main()
