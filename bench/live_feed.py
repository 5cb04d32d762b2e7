"""The board's live feed: how soon a change reaches a viewer, next to its floor measured in
the same run.

A real coordinator (SQLite) and exporter on loopback, serving one simulated board, and a
viewer of ``GET /api/v1/events`` (what the web page's board follows). Each round reserves
the board and releases it; measured from sending the request to the viewer reading the
device's event that shows it (``allocating``, then ``reclaiming``, or the state after it
where the feed's read found both changes made). Floor: a bare
``GET /health`` round trip to the same coordinator. Goal: within a second, far within it:
the feed is pushed, never polled (README, "Web page and metrics").

Usage: bench/live_feed.py [--rounds 50]
"""
from __future__ import annotations

import argparse
import json
import queue
import threading
import time

import httpx2

from local_lab import local_lab, ms, pct

BOARD = "sim-0"
GOAL_S = 1.0


def follow(url: str, seen: queue.SimpleQueue, watching: threading.Event, stop: threading.Event) -> None:
    """Put (when read, device) for each ``device`` event of the feed in ``seen``; set
    ``watching`` once the feed's snapshot came (device events come only after it)."""
    with httpx2.Client(timeout=httpx2.Timeout(10, read=None)) as http:
        with http.stream("GET", f"{url}/api/v1/events", headers={"Accept": "text/event-stream"}) as response:
            event = None
            for line in response.iter_lines():
                if stop.is_set():
                    return
                if line.startswith("event: "):
                    event = line[len("event: "):]
                    if event == "snapshot":
                        watching.set()
                elif line.startswith("data: ") and event == "device":
                    seen.put((time.perf_counter(), json.loads(line[len("data: "):])))


def until(seen: queue.SimpleQueue, *states: str) -> tuple[float, str]:
    """When the viewer read the board's first event in one of ``states``, and that state."""
    while True:
        at, device = seen.get(timeout=30)
        if device["name"] == BOARD and device["state"] in states:
            return at, device["state"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    rounds = parser.parse_args().rounds
    with local_lab([{"name": BOARD, "plugin": "sim", "class": "sim-board"}], heartbeat_s=1.0) as lab:
        seen: queue.SimpleQueue = queue.SimpleQueue()
        watching, stop = threading.Event(), threading.Event()
        threading.Thread(target=follow, args=(lab.url, seen, watching, stop), daemon=True).start()
        if not watching.wait(30):
            raise SystemExit("the live feed sent no snapshot")
        reserved, released, floor = [], [], []
        for _ in range(rounds):
            sent = time.perf_counter()
            lease = lab.api.post("/leases", json={"device": BOARD, "ttl_s": 600}).json()
            at, _ = until(seen, "allocating", "in_use")  # (two changes in one read: one event)
            reserved.append(at - sent)
            sent = time.perf_counter()
            lab.api.post(f"/leases/{lease['id']}/release")
            at, state = until(seen, "reclaiming", "idle")
            released.append(at - sent)
            if state != "idle":
                until(seen, "idle")
            sent = time.perf_counter()
            lab.api.get("/health")
            floor.append(time.perf_counter() - sent)
        stop.set()
    print(f"a change -> its event on the live feed, {rounds} rounds; floor: GET /health p50 {ms(pct(floor, 50))}")
    for what, values in (("reserve", reserved), ("release", released)):
        print(f"  {what:>8}: p50 {ms(pct(values, 50))}  p99 {ms(pct(values, 99))}  max {ms(max(values))}  "
              f"p50/floor {pct(values, 50) / pct(floor, 50):6.1f}x  goal < {GOAL_S:.0f} s: "
              f"{'met' if max(values) < GOAL_S else 'MISSED'}")


if __name__ == "__main__":
    main()
