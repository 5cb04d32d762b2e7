"""``device-loop with`` beside the same by hand, and how soon a cancel frees the board
(docs/architecture.md, "A lease bound to a command").

A real coordinator and exporter on loopback serving one simulated board. In turns, in one run:

1. ``device-loop with sim-board-0 -- true``: from its start to its end (reserve, wait until
   ready, run, release), against ``device-loop reserve sim-board-0 --wait``, ``true`` and
   ``device-loop release sim-board-0`` run by hand one after the other. Between two runs the
   board is waited for until idle again (untimed). Target: ``with`` at most 1.2x by hand.
2. Cancel: ``device-loop with sim-board-0 -- sleep 1000`` gets SIGINT once its command
   runs; the time from the signal to its lease released, and to the board idle again
   (its services stopped and reported), p50 / p99.

Usage: bench/with_overhead.py [-n 15]
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_lab import local_lab, ms, pct, wait  # noqa: E402

TARGET_RATIO = 1.2
DEVICE = "sim-board-0"


def cli(env: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``device-loop ARGS`` in a process of its own, as a person or a CI step runs it."""
    done = subprocess.run([sys.executable, "-m", "device_loop.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120)
    if check and done.returncode != 0:
        raise SystemExit(f"device-loop {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done


def idle(lab) -> None:
    """Wait until the board is idle again (its steps between leases done)."""
    wait(lambda: lab.api.get(f"/devices/{DEVICE}").json()["state"] == "idle", 30, f"{DEVICE} idle")


def with_true(lab) -> float:
    """Seconds of ``device-loop with DEVICE -- true``."""
    begun = time.perf_counter()
    cli(lab.env, "with", DEVICE, "--", "true")
    return time.perf_counter() - begun


def by_hand(lab) -> float:
    """Seconds of the same by hand: ``reserve --wait``, ``true``, ``release``."""
    begun = time.perf_counter()
    cli(lab.env, "reserve", DEVICE, "--wait")
    subprocess.run(["true"], check=True)
    cli(lab.env, "release", DEVICE)
    return time.perf_counter() - begun


def cancel(lab, folder: Path) -> tuple[float, float]:
    """(signal → lease released, signal → board idle), in seconds."""
    started = folder / f"started-{time.monotonic_ns()}"
    proc = subprocess.Popen([sys.executable, "-m", "device_loop.cli", "with", DEVICE, "--", "sh", "-c",
                             f"touch {started}; exec sleep 1000"], env=lab.env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    wait(started.exists, 30, "the command started")
    lease = lab.api.get("/leases").json()[0]["id"]
    sent = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    wait(lambda: lab.api.get(f"/leases/{lease}").json()["state"] == "released", 10, "the lease released")
    released = time.perf_counter() - sent
    idle(lab)
    free = time.perf_counter() - sent
    if proc.wait(10) != 128 + signal.SIGINT:
        raise SystemExit(f"with exited {proc.returncode} on SIGINT, not 130")
    return released, free


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=15, help="runs of each")
    n = parser.parse_args().n
    devices = [{"name": DEVICE, "plugin": "sim", "class": "sim-board"}]
    with local_lab(devices, heartbeat_s=1.0) as lab, tempfile.TemporaryDirectory(prefix="with-bench-") as folder:
        cli(lab.env, "ls")  # (warm the interpreter's file cache)
        withs, hands = [], []
        for _ in range(n):
            idle(lab)
            withs.append(with_true(lab))
            idle(lab)
            hands.append(by_hand(lab))
        cancels = []
        for _ in range(n):
            idle(lab)
            cancels.append(cancel(lab, Path(folder)))
    with_median, hand_median = statistics.median(withs), statistics.median(hands)
    ratio = with_median / hand_median
    released, free = [c[0] for c in cancels], [c[1] for c in cancels]
    print(f"{n} runs of each, load average {os.getloadavg()[0]:.1f}")
    print(f"  with {DEVICE} -- true                    median {ms(with_median)}  (p99 {ms(pct(withs, 99))})")
    print(f"  reserve --wait + true + release by hand   median {ms(hand_median)}  (p99 {ms(pct(hands, 99))})")
    print(f"  ratio {ratio:.2f}x  (target <= {TARGET_RATIO}x): {'ok' if ratio <= TARGET_RATIO else 'OVER'}")
    print(f"  cancel (SIGINT) -> lease released   p50 {ms(pct(released, 50))}  p99 {ms(pct(released, 99))}")
    print(f"  cancel (SIGINT) -> board idle again p50 {ms(pct(free, 50))}  p99 {ms(pct(free, 99))}")


if __name__ == "__main__":
    main()
