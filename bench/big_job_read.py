"""How long ``/health`` stalls while a job with the most runs a job holds is read
(docs/architecture.md, "Shares of one lab": large answers are built off the event loop).

A real coordinator (single-user, SQLite in a temporary folder) on loopback; one job of the
shape the most runs take (a matrix of 16 cells, A/B with 20 warmup and 200 rounds: 7,040
runs, each with a 4,000-character output tail, 16 samples and 64 temperatures, ~10 KB),
its runs reported as a worker reports them. Then, ``-n`` times: ``GET /jobs/ID`` (and,
where the coordinator has it, every page of ``GET /jobs/ID/runs``) while a thread asks
``/health`` every 10 ms; printed: each read's time and size, and /health's longest answer
while it ran, beside its longest when idle.

Run it against another checkout to compare: ``PYTHONPATH=/path/to/checkout python
bench/big_job_read.py`` (the coordinator runs from the same path).

Usage: bench/big_job_read.py [-n 3] [--runs 7040]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx2

from concurrent.futures import ThreadPoolExecutor

from device_loop.core.ports import free_port, wait_port_open

CELLS, PER_CELL = 16, 440


def spec() -> dict:
    return {"title": "big", "target": {"class": "sim-board"}, "metrics": [{"name": f"m{i}"} for i in range(16)],
            "matrix": {"over": [f"tags=t{i}" for i in range(CELLS)]},
            "ab": {"baseline": ["true"], "patch": ["true"], "rounds": 200, "warmup": 20, "settle": False}}


def a_run(n: int) -> dict:
    cell, seq = divmod(n, PER_CELL)
    return {"cell": cell, "attempt": 0, "seq": seq, "arm": "A" if seq % 2 == 0 else "B",
            "warmup": seq < 40, "started_at": 1.7e9 + n, "ended_at": 1.7e9 + n + 0.5, "status": 0,
            "readings": {"temperatures": {f"zone{z}": 40.0 + z / 10 for z in range(64)}, "governor": "performance"},
            "samples": [{"metric": f"m{i}", "value": 1.0 + (n % 7) / 100 + i, "unit": "ms"} for i in range(16)],
            "output_tail": ("x" * 79 + "\n") * 50, "failure": None}


def report_runs(url: str, headers: dict, job_id: str, count: int) -> None:
    """Report ``count`` runs of ``job_id``, four at a time."""
    def report(numbers: range) -> None:
        with httpx2.Client(base_url=url, headers=headers, timeout=60) as api:
            for n in numbers:
                api.post(f"/jobs/{job_id}/runs", json=a_run(n)).raise_for_status()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(report, [range(start, count, 4) for start in range(4)]))


class HealthWatch:
    """A thread asking /health every 10 ms; ``longest`` of its answers since ``reset``."""

    def __init__(self, url: str):
        self.url, self.longest, self.stop = url, 0.0, threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        with httpx2.Client(timeout=60) as client:
            while not self.stop.is_set():
                began = time.perf_counter()
                client.get(f"{self.url}/api/v1/health").raise_for_status()
                self.longest = max(self.longest, time.perf_counter() - began)
                time.sleep(0.01)

    def reset(self) -> None:
        self.longest = 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3)
    parser.add_argument("--runs", type=int, default=CELLS * PER_CELL)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="big-job-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    database = f"sqlite:///{folder / 'coordinator.sqlite'}"
    env = {**os.environ, "DEVICE_LOOP_DATABASE_URL": database}
    coordinator = subprocess.Popen([sys.executable, "-m", "device_loop.cli", "coordinator", "--single-user",
                                    "--port", str(port), "--data-dir", str(folder)], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port_open("127.0.0.1", port, 30)
        headers = {"X-Device-Loop-User": "alice"}
        with httpx2.Client(base_url=f"{url}/api/v1", headers=headers, timeout=600) as api:
            job = api.post("/jobs", json={"spec": spec(), "claim": True}).json()
            report_runs(f"{url}/api/v1", headers, job["id"], args.runs)
            watch = HealthWatch(url)
            time.sleep(1.0)
            idle = watch.longest
            print(f"{args.runs} runs; /health idle: longest {idle * 1000:.1f} ms")
            for attempt in range(args.n):
                watch.reset()
                began = time.perf_counter()
                answer = api.get(f"/jobs/{job['id']}")
                took = time.perf_counter() - began
                shown = answer.json()
                line = (f"GET /jobs/ID: {took:.2f} s, {len(answer.content) / 2**20:.1f} MiB, "
                        f"{len(shown['runs'])} of {shown['run_count']} runs; /health longest "
                        f"{watch.longest * 1000:.0f} ms")
                after = shown.get("runs_next")
                if after:
                    watch.reset()
                    began, pages, size = time.perf_counter(), 0, 0
                    while after:
                        page = api.get(f"/jobs/{job['id']}/runs", params={"after": after, "limit": 500})
                        size += len(page.content)
                        pages += 1
                        after = page.json()["next"]
                    line += (f"; the other runs in {pages} pages: {time.perf_counter() - began:.2f} s, "
                             f"{size / 2**20:.1f} MiB, /health longest {watch.longest * 1000:.0f} ms")
                print(f"{attempt + 1}: {line}")
            watch.stop.set()
    finally:
        coordinator.terminate()
        coordinator.wait(10)


if __name__ == "__main__":
    main()
