"""The fast path, each figure next to its floor measured in the same run.

A real coordinator (SQLite) and exporter on loopback, serving N simulated boards and one
real UART (ser2net on a socat pty pair), for N = 0, 20 and 200:

- reserve + release cycles/s through the Python client ``Lab``, round-robin over the sim
  boards; floor: two bare HTTP round trips to the same coordinator.
- reserve -> first byte back through the lease's ser2net endpoint; floor: ser2net started
  by hand on a free port, connected to and read from.
- release -> device idle again.
- coordinator RSS, before and after the first agent (MCP) call.

Then, at 200 boards: 100 simulated hosts x 20 devices heartbeating every 5 s while a
reserve/release loop runs, and one host of 1000 devices reporting (new, then changed)
in the middle of it: heartbeat latency, and how long reserves waited. Last, the CLI as
processes, next to a bare ``python -c pass``.
"""
from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2

from device_loop.client.lab import Lab
from device_loop.core.ports import free_port, wait_port_open
from device_loop.plugins.uart import _ser2net
from device_loop.plugins.uart.ser2net import _connection
from local_lab import SimHost, local_lab, ms, pct, pty_pair, wait


def sim_boards(n: int) -> list[dict]:
    return [{"name": f"sim-{i}", "plugin": "sim", "class": "sim-board"} for i in range(n)]


def echo(host: str, port: int) -> None:
    """Send a byte through a UART endpoint and read it back (the far end echoes)."""
    with socket.create_connection((host, port), timeout=5) as conn:
        conn.sendall(b"x")
        if conn.recv(1) != b"x":
            raise SystemExit("the far end did not echo")


def wait_idle(api: httpx2.Client, device: str) -> None:
    wait(lambda: api.get(f"/devices/{device}").json()["state"] == "idle", 30, f"{device} idle")


# ---- per lab size ----------------------------------------------------------------------

def cycles(url: str, names: list[str], seconds: float) -> tuple[float, float]:
    """(reserve + release cycles/s, floor: pairs of bare HTTP round trips/s)."""
    lab = Lab(url, user="bench")
    done, started, i = 0, time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        name = names[i % len(names)]
        i += 1
        try:
            lab.reserve(name, "10m").release()
            done += 1
        except Exception as exc:  # still reclaiming from the last round: take the next board
            if getattr(exc, "code", "") != "busy":
                raise
    rate = done / (time.perf_counter() - started)
    floor_started, pairs = time.perf_counter(), 0
    while time.perf_counter() - floor_started < seconds / 2:
        lab.api.get("/health")
        lab.api.get("/health")
        pairs += 1
    lab.api.close()
    return rate, pairs / (time.perf_counter() - floor_started)


def first_bytes(url: str, api: httpx2.Client, rounds: int) -> tuple[list[float], list[float]]:
    """(reserve -> first byte, release -> idle) of the UART ``jupiter``."""
    lab = Lab(url, user="bench")
    to_byte, to_idle = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        lease = lab.reserve("jupiter", "10m").wait_ready(30)
        raw = next(e for e in lease.endpoints if e.get("protocol") == "raw")
        echo(raw["host"], raw["port"])
        to_byte.append(time.perf_counter() - started)
        started = time.perf_counter()
        lease.release()
        wait(lambda: api.get("/devices/jupiter").json()["state"] == "idle", 30, "jupiter idle")
        to_idle.append(time.perf_counter() - started)
    lab.api.close()
    return to_byte, to_idle


def ser2net_floor(near: Path, rounds: int) -> list[float]:
    """ser2net started by hand: spawn -> accepting -> a byte echoed back."""
    folder = Path(near).parent
    samples = []
    for i in range(rounds):
        port = free_port()
        config = folder / f"floor-{i}.yaml"
        config.write_text(_connection("floor", f"tcp,127.0.0.1,{port}", str(near), 115200, "8N1"))
        started = time.perf_counter()
        proc = subprocess.Popen([_ser2net(), "-n", "-d", "-u", "-c", str(config)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port_open("127.0.0.1", port, timeout=5)
        echo("127.0.0.1", port)
        samples.append(time.perf_counter() - started)
        proc.terminate()
        proc.wait()
    return samples


def per_size(sizes: list[int], rounds: int, seconds: float) -> dict[int, dict]:
    results = {}
    with pty_pair() as (near, _far):
        floor = ser2net_floor(near, rounds)
        for n in sizes:
            uart = {"name": "jupiter", "plugin": "uart", "path": str(near), "raw": True}
            with local_lab([uart, *sim_boards(n)]) as lab:
                to_byte, to_idle = first_bytes(lab.url, lab.api, rounds)
                rate, rate_floor = cycles(lab.url, [f"sim-{i}" for i in range(n)], seconds) if n else (0, 0)
                results[n] = {"byte": to_byte, "idle": to_idle, "rate": rate, "rate_floor": rate_floor,
                              "rss": lab.coordinator_rss_mib(), "floor": floor}
                agent_hello(lab.url)  # the MCP SDK loads at the first agent call
                results[n]["rss_agents"] = lab.coordinator_rss_mib()
    return results


def agent_hello(url: str) -> None:
    """One MCP call (initialize), as an agent's first."""
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}
    answer = httpx2.post(f"{url}/mcp", json=hello, headers={"Accept": "application/json, text/event-stream"})
    if answer.status_code != 200:
        raise SystemExit(f"/mcp answered {answer.status_code}: {answer.text}")


# ---- heartbeats under load ---------------------------------------------------------------

def heartbeat_load(seconds: float) -> dict:
    with local_lab(sim_boards(200)) as lab:
        http = httpx2.Client(base_url=f"{lab.url}/api/v1", timeout=30,
                             headers={"Content-Type": "application/json", "X-Device-Loop-User": "bench"})
        hosts = [SimHost(f"load{i:03d}", 20) for i in range(100)]
        for host in hosts:  # they join first: the load is the steady state
            http.post(f"/hosts/{host.name}/heartbeat", content=host.body())
        beats, reserves, big = [], [], []
        stop = threading.Event()

        def beat(host: SimHost, body: bytes, into: list) -> None:
            started = time.perf_counter()
            answer = http.post(f"/hosts/{host.name}/heartbeat", content=body)
            into.append((started, time.perf_counter(), answer.status_code))

        def reserve_loop() -> None:
            lab_client, i = Lab(lab.url, user="bench"), 0
            while not stop.is_set():
                i += 1
                started = time.perf_counter()
                try:
                    lease = lab_client.reserve(f"sim-{i % 200}", "10m")
                except Exception:
                    continue
                reserves.append((started, time.perf_counter()))
                lease.release()
                time.sleep(0.005)

        health = []

        def health_loop() -> None:  # the floor: a bare round trip to the same coordinator, under the same load
            while not stop.is_set():
                started = time.perf_counter()
                http.get("/health")
                health.append(time.perf_counter() - started)
                time.sleep(0.02)

        loops = [threading.Thread(target=reserve_loop, daemon=True), threading.Thread(target=health_loop, daemon=True)]
        for loop in loops:
            loop.start()
        giant = SimHost("giant", 1000)
        with ThreadPoolExecutor(8) as pool:
            started = time.perf_counter()
            t = 0
            while t < seconds:
                for k, host in enumerate(hosts):  # every host once per 5 s, spread evenly
                    at = started + t + k * 5.0 / len(hosts)
                    time.sleep(max(0.0, at - time.perf_counter()))
                    pool.submit(beat, host, host.body(), beats)
                    if t == 5.0 and k in (0, 30, 60, 90):  # the 1000-device host: new, changed, back, unchanged
                        pool.submit(beat, giant, giant.body("failed" if k == 30 else "ok"), big)
                t += 5.0
        stop.set()
        for loop in loops:
            loop.join()
        http.close()
    latency = [end - start for start, end, _ in beats]
    reserve_latency = [end - start for start, end in reserves]
    behind_big = [end - start for start, end in reserves
                  if any(s <= end and start <= e for s, e, _ in big)]
    return {"beats": latency, "codes": {c for *_, c in beats + big}, "big": [e - s for s, e, _ in big],
            "reserves": reserve_latency, "behind_big": behind_big, "health": health}


# ---- the CLI ---------------------------------------------------------------------------------

def cli(rounds: int) -> dict:
    command = shutil.which("device-loop", path=str(Path(sys.executable).parent)) or "device-loop"
    with local_lab(sim_boards(2)) as lab:
        def timed(*argv) -> float:
            started = time.perf_counter()
            subprocess.run(argv, env=lab.env, check=True, stdout=subprocess.DEVNULL)
            return time.perf_counter() - started

        bare = [timed(sys.executable, "-c", "pass") for _ in range(rounds)]
        ls = [timed(command, "ls") for _ in range(rounds)]
        pair = []
        for _ in range(rounds):
            reserve = timed(command, "reserve", "sim-0", "--json")
            pair.append(reserve + timed(command, "release", "sim-0"))
            wait_idle(lab.api, "sim-0")
    return {"bare": statistics.median(bare), "ls": statistics.median(ls), "pair": statistics.median(pair)}


def report_sizes(sizes: dict[int, dict], rounds: int) -> None:
    floor = sizes[0]["floor"]
    print(f"reserve -> first byte through ser2net, {rounds} leases of one UART; floor: ser2net by hand "
          f"p50 {ms(pct(floor, 50))}")
    print(f"  {'sim boards':>10} {'p50':>10} {'p99':>10} {'p50/floor':>10} {'p50/alone':>10} "
          f"{'release->idle p50':>18} {'cycles/s':>9} {'floor/s':>8} {'ratio':>6} {'RSS':>9} {'+MCP':>9}")
    alone = pct(sizes[0]["byte"], 50)
    for n, r in sizes.items():
        p50 = pct(r["byte"], 50)
        cycle = (f"{r['rate']:9.0f} {r['rate_floor']:8.0f} {r['rate'] / r['rate_floor']:6.2f}" if n
                 else f"{'-':>9} {'-':>8} {'-':>6}")
        print(f"  {n:>10} {ms(p50)} {ms(pct(r['byte'], 99))} {p50 / pct(floor, 50):9.2f}x {p50 / alone:9.2f}x "
              f"{ms(pct(r['idle'], 50)):>18} {cycle} {r['rss']:6.1f} MiB {r['rss_agents']:5.1f} MiB")


def report_load(load: dict, seconds: float) -> None:
    beats, reserves = load["beats"], load["reserves"]
    print(f"heartbeats of 100 hosts x 20 devices every 5 s for {seconds:g} s, with a reserve/release "
          f"loop over 200 sim boards (answers: {sorted(load['codes'])})")
    print(f"  heartbeat: {len(beats)}, p50 {ms(pct(beats, 50))}, p99 {ms(pct(beats, 99))}; floor, GET /health "
          f"meanwhile: p50 {ms(pct(load['health'], 50))}, p99 {ms(pct(load['health'], 99))}")
    print(f"  1000-device heartbeat (new, changed, changed back, unchanged): "
          f"{', '.join(ms(b).strip() for b in load['big'])}")
    print(f"  reserve under load: {len(reserves)}, p50 {ms(pct(reserves, 50))}, p99 {ms(pct(reserves, 99))}, "
          f"max {ms(max(reserves))}; overlapping a 1000-device heartbeat: "
          f"max {ms(max(load['behind_big'], default=0))}")


def report_cli(timings: dict) -> None:
    print(f"CLI as processes (median of 7): python -c pass {ms(timings['bare'])}; device-loop ls {ms(timings['ls'])} "
          f"({timings['ls'] / timings['bare']:.1f}x); reserve + release pair {ms(timings['pair'])} "
          f"({timings['pair'] / timings['bare']:.1f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=30, help="reservations of the UART per lab size (default 30)")
    parser.add_argument("--seconds", type=float, default=5, help="seconds of reserve/release cycles (default 5)")
    parser.add_argument("--load-seconds", type=float, default=15, help="seconds of heartbeat load (default 15)")
    parser.add_argument("--only", choices=["sizes", "load", "cli"], help="run one part")
    args = parser.parse_args()
    if args.only in (None, "sizes"):
        report_sizes(per_size([0, 20, 200], args.n, args.seconds), args.n)
    if args.only in (None, "load"):
        report_load(heartbeat_load(args.load_seconds), args.load_seconds)
    if args.only in (None, "cli"):
        report_cli(cli(7))


if __name__ == "__main__":
    main()
