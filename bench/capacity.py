"""Capacity: many hosts heartbeating while clients reserve and release, on SQLite and on
PostgreSQL with one and two coordinator processes, side by side in one run.

Each configuration gets a fresh database and coordinators only, no exporter. HOSTS
simulated hosts (``SimHost``) of 20 devices heartbeat every 5 s, spread evenly (500
hosts: 100 heartbeats/s), sent on schedule whatever the answers, from bodies encoded
beforehand. Meanwhile CLIENTS clients, threads of a process of their own, reserve and
release the load hosts' devices in turn as fast as they are answered: ``POST /leases``
then ``POST /leases/{id}/release`` with an Idempotency-Key each, the two requests of
``Lab.reserve(...).release()``. No exporter serves these devices, so each lease is
released while still pending and its device is reclaimed at its host's next heartbeat:
the loop measures the coordinator and its database, not an exporter. With two processes,
each request goes to the next process in turn, as a reverse proxy's round robin would.

Target: two processes on PostgreSQL serve at least the cycles/s of one SQLite process,
with heartbeat p99 <= 50 ms. The load generator shares the machine with the coordinators
and the database: its CPU is shown beside theirs, and how late it sent.

Usage: bench/capacity.py [--seconds 60] [--hosts 500] [--clients 4] [--postgres ADMIN_URL]
(the admin URL defaults to DEVICE_LOOP_TEST_POSTGRES, which bench/run sets)
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import math
import os
import shutil
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import asyncpg
import httpx2

from device_loop.core.ports import free_port
from local_lab import SimHost, bench_env, cpu_seconds, ms, pct, start_coordinator, stop

POSTGRES_ENV = "DEVICE_LOOP_TEST_POSTGRES"
HEARTBEAT_S = 5.0
DEVICES_PER_HOST = 20
P99_TARGET_S = 0.050
ON_TIME_S = 0.010  # the generator kept its schedule if its p99 lateness stayed under this
CONFIGURATIONS = [("SQLite", 1), ("PostgreSQL", 1), ("PostgreSQL", 2)]


# ---- the system under test ----------------------------------------------------------------

async def _admin(admin_url: str, sql: str) -> None:
    connection = await asyncpg.connect(admin_url)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


@contextlib.contextmanager
def postgres_database(admin_url: str):
    """A database of its own on ``admin_url``'s server, dropped afterwards: (its URL, its name)."""
    name = f"capacity_{uuid.uuid4().hex[:10]}"
    asyncio.run(_admin(admin_url, f"CREATE DATABASE {name}"))
    try:
        yield f"{admin_url.rsplit('/', 1)[0]}/{name}", name
    finally:
        asyncio.run(_admin(admin_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@contextlib.contextmanager
def coordinators(database_url: str | None, count: int):
    """``count`` coordinator processes on ``database_url`` (None: SQLite in their folder): (URLs, processes)."""
    folder = Path(tempfile.mkdtemp(prefix="devloop-capacity-"))
    extra = ("--database-url", database_url) if database_url else ()
    procs, urls = [], []
    try:
        for n in range(count):  # one after the other: the first one migrates the database
            port = free_port()
            procs.append(start_coordinator(folder / f"coord{n}", bench_env(folder), port, *extra))
            urls.append(f"http://127.0.0.1:{port}")
        yield urls, procs
    finally:
        stop(procs)
        shutil.rmtree(folder, ignore_errors=True)


# ---- CPU ------------------------------------------------------------------------------------

def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy (all cores; not idle, not waiting on I/O)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def postgres_cpu(pids: list[int]) -> dict[int, float]:
    """CPU seconds of those of ``pids`` that are PostgreSQL processes on this machine."""
    used = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"postgres"):
                used[pid] = cpu_seconds(pid)
    return used


async def cpu_sample(procs: list, admin: asyncpg.Connection | None, database: str | None) -> dict:
    """CPU seconds so far of the coordinators, of the database's server processes, of this
    process and of the machine."""
    backends = [r["pid"] for r in await admin.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = $1", database)] if admin else []
    return {"at": time.perf_counter(), "coordinators": [cpu_seconds(p.pid) for p in procs],
            "postgres": postgres_cpu(backends), "heartbeats": time.process_time(), "machine": machine_busy()}


def cpu_used(before: dict, after: dict, reserve_cpu: float) -> dict:
    """Cores used between two samples (CPU seconds per second): by whom."""
    took = after["at"] - before["at"]
    coordinators = [(b - a) / took for a, b in zip(before["coordinators"], after["coordinators"])]
    postgres = sum(used - before["postgres"].get(pid, 0.0) for pid, used in after["postgres"].items()) / took
    generator = (after["heartbeats"] - before["heartbeats"] + reserve_cpu) / took
    machine = (after["machine"] - before["machine"]) / took
    return {"coordinators": coordinators, "postgres": postgres, "generator": generator, "machine": machine,
            "others": machine - sum(coordinators) - postgres - generator}


# ---- heartbeats -------------------------------------------------------------------------------

async def beat(http: httpx2.AsyncClient, url: str, host: str, body: bytes) -> tuple[float, str]:
    """One heartbeat: (seconds to the answer, its status or the exception's name)."""
    started = time.perf_counter()
    try:
        answer = await http.post(f"{url}/api/v1/hosts/{host}/heartbeat", content=body)
        outcome = str(answer.status_code)
    except httpx2.HTTPError as exc:
        outcome = type(exc).__name__
    return time.perf_counter() - started, outcome


async def join(http: httpx2.AsyncClient, urls: list[str], hosts: list[SimHost]) -> None:
    """Every host's first heartbeat (its devices new), a few at a time: the load is the steady state."""
    turns = asyncio.Semaphore(8)

    async def first(n: int, host: SimHost) -> None:
        async with turns:
            _, outcome = await beat(http, urls[n % len(urls)], host.name, host.body())
        if outcome != "200":
            raise SystemExit(f"host {host.name} could not join: {outcome}")

    await asyncio.gather(*(first(n, host) for n, host in enumerate(hosts)))


async def heartbeats(http: httpx2.AsyncClient, urls: list[str], hosts: list[SimHost], bodies: list[list[bytes]],
                     started: float, seconds: float) -> tuple[list[tuple[float, str]], list[float]]:
    """Each host's heartbeat every 5 s from ``started`` (``perf_counter``) for ``seconds``, the
    hosts spread evenly, each sent at its time whatever the others' answers: (each heartbeat's
    seconds and outcome, how late each was sent)."""
    proxy, period = itertools.cycle(urls), HEARTBEAT_S / len(hosts)
    sending, late = [], []
    for n in range(round(seconds / period)):
        turn, k = divmod(n, len(hosts))
        at = started + n * period
        await asyncio.sleep(at - time.perf_counter())
        late.append(time.perf_counter() - at)
        sending.append(asyncio.create_task(beat(http, next(proxy), hosts[k].name, bodies[turn][k])))
    return await asyncio.gather(*sending), late


# ---- reserve + release, in a process of its own ------------------------------------------------

def posting(user: str) -> dict:
    """The headers of a POST as ``Lab`` sends it: who, and an Idempotency-Key of its own."""
    return {"X-Device-Loop-User": user, "Idempotency-Key": uuid.uuid4().hex}


def client(http: httpx2.Client, proxy, user: str, devices: list[str],
           deadline: float) -> tuple[list[float], collections.Counter]:
    """Reserve and release ``devices`` in turn until ``deadline``: (each cycle's seconds, other answers)."""
    cycles, other = [], collections.Counter()
    for device in itertools.cycle(devices):
        if time.perf_counter() >= deadline:
            break
        started = time.perf_counter()
        try:
            lease = http.post(f"{next(proxy)}/api/v1/leases", json={"device": device, "ttl_s": 600},
                              headers=posting(user))
            if lease.status_code != 201:
                other[f"reserve {lease.status_code} {lease.json().get('error')}"] += 1
                continue
            release = http.post(f"{next(proxy)}/api/v1/leases/{lease.json()['id']}/release", headers=posting(user))
        except httpx2.HTTPError as exc:
            other[type(exc).__name__] += 1
            continue
        if release.status_code != 200:
            other[f"release {release.status_code} {release.json().get('error')}"] += 1
            continue
        cycles.append(time.perf_counter() - started)
    return cycles, other


def reserve_release(urls: list[str], devices: list[str], clients: int, start_at: float, seconds: float) -> dict:
    """``clients`` clients, a thread and a connection each (a synchronous client costs half the
    CPU of an asynchronous one), cycling over ``devices`` from ``start_at`` (``time.time()``)
    for ``seconds``: each cycle's seconds, the other answers, and the CPU seconds this took."""
    proxy = itertools.cycle(urls)
    https = [httpx2.Client(timeout=30, verify=False) for _ in range(clients)]
    time.sleep(max(0.0, start_at - time.time()))
    cpu, deadline = time.process_time(), time.perf_counter() + seconds
    with ThreadPoolExecutor(max(1, clients)) as threads:
        runs = list(threads.map(lambda c: client(https[c], proxy, f"bench-{c}", devices[c::clients], deadline),
                                range(clients)))
    cpu = time.process_time() - cpu
    for http in https:
        http.close()
    return {"cycles": [c for cycles, _ in runs for c in cycles],
            "other": sum((other for _, other in runs), collections.Counter()), "cpu": cpu}


def ready() -> None:
    """Nothing: the reserve process is started (and its imports done) before it is timed."""


# ---- one configuration -------------------------------------------------------------------------

async def measure(urls: list[str], procs: list, admin_url: str | None, database: str | None, args,
                  reserving: ProcessPoolExecutor) -> dict:
    """Join the hosts, then heartbeats and reserve + release cycles at once for ``args.seconds``."""
    hosts = [SimHost(f"load{i:03d}", DEVICES_PER_HOST) for i in range(args.hosts)]
    admin = await asyncpg.connect(admin_url) if database else None
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=args.hosts, keepalive_expiry=2.0)
    async with httpx2.AsyncClient(timeout=30, limits=limits, headers={"Content-Type": "application/json"}) as http:
        await join(http, urls, hosts)
        bodies = [[host.body() for host in hosts] for _ in range(math.ceil(args.seconds / HEARTBEAT_S))]
        devices = [host.devices[i].name for i in range(DEVICES_PER_HOST) for host in hosts]  # hosts in turn
        start_at = time.time() + 0.2
        cycling = asyncio.get_running_loop().run_in_executor(
            reserving, reserve_release, urls, devices, args.clients, start_at, args.seconds)
        await asyncio.sleep(start_at - time.time())
        before = await cpu_sample(procs, admin, database)
        sending = asyncio.create_task(heartbeats(http, urls, hosts, bodies, before["at"], args.seconds))
        await asyncio.sleep(args.seconds)
        after = await cpu_sample(procs, admin, database)
        beats, late = await sending
        reserves = await cycling
    if admin:
        await admin.close()
    return {"beats": beats, "late": late, "cycles": reserves["cycles"], "other": reserves["other"],
            "reserve_cpu": reserves["cpu"] / args.seconds, "cpu": cpu_used(before, after, reserves["cpu"])}


def run(kind: str, processes: int, admin_url: str | None, args, reserving: ProcessPoolExecutor) -> dict:
    """One configuration, on a fresh database."""
    database = postgres_database(admin_url) if kind == "PostgreSQL" else contextlib.nullcontext((None, None))
    with database as (url, name), coordinators(url, processes) as (urls, procs):
        return asyncio.run(measure(urls, procs, admin_url, name, args, reserving))


# ---- report --------------------------------------------------------------------------------------

def spread(values: list[float], *percentiles: float) -> str:
    """``values``' percentiles, then their maximum, in milliseconds (dashes for none)."""
    if not values:
        return " ".join(f"{'-':>10}" for _ in range(len(percentiles) + 1))
    return " ".join([*(ms(pct(values, p)) for p in percentiles), ms(max(values))])


def report_configuration(label: str, r: dict, seconds: float) -> None:
    took = [t for t, _ in r["beats"]]
    errors = collections.Counter(o for _, o in r["beats"] if o != "200")
    cycles, cpu = r["cycles"], r["cpu"]
    print(f"  {label:<15} {len(took):>6} {spread(took, 50, 99)} {sum(errors.values()):>6} "
          f"{len(cycles) / seconds:>9.1f} {spread(cycles, 50, 99)}   {spread(r['late'], 99)}")
    requests = len(took) + 2 * len(cycles)
    print(f"  {'':<15} CPU, cores: coordinator{'s' if len(cpu['coordinators']) > 1 else ''} "
          f"{' + '.join(f'{c:.2f}' for c in cpu['coordinators'])} "
          f"({ms(sum(cpu['coordinators']) * seconds / requests).strip()} a request), PostgreSQL {cpu['postgres']:.2f}, "
          f"load generator {cpu['generator']:.2f} (reserve clients {r['reserve_cpu']:.2f}), "
          f"others {max(0.0, cpu['others']):.2f}; machine busy {cpu['machine']:.2f} of {os.cpu_count()}")
    for what, count in sorted((errors + r["other"]).items()):
        print(f"  {'':<15} {count} x {what}")
    if pct(r["late"], 99) > ON_TIME_S:
        print(f"  {'':<15} the generator sent heartbeats late (p99 over {ms(ON_TIME_S).strip()}): "
              "these figures are partly the generator's")
    if r["reserve_cpu"] > 0.9:
        print(f"  {'':<15} the reserve clients used a whole core: cycles/s may be the generator's limit")


def report(results: dict[str, dict], args) -> None:
    print(f"capacity: {args.hosts} hosts x {DEVICES_PER_HOST} devices heartbeating every {HEARTBEAT_S:g} s "
          f"({args.hosts / HEARTBEAT_S:g}/s), {args.clients} clients reserving and releasing those devices "
          f"(over HTTP, each lease released while pending: no exporter), {args.seconds:g} s a configuration")
    print(f"this machine's {os.cpu_count()} cores serve the coordinators, PostgreSQL and this load generator "
          f"at once (its CPU is below; 'others' is what else ran meanwhile)")
    print(f"  {'configuration':<15} {'beats':>6} {'beat p50':>10} {'p99':>10} {'max':>10} {'errors':>6} "
          f"{'cycles/s':>9} {'cycle p50':>10} {'p99':>10} {'max':>10}   {'late p99':>10} {'max':>10}")
    for label, r in results.items():
        report_configuration(label, r, args.seconds)
    if not {"SQLite x1", "PostgreSQL x2"} <= results.keys():
        return
    sqlite, two = results["SQLite x1"], results["PostgreSQL x2"]
    rate = len(two["cycles"]) / max(1, len(sqlite["cycles"]))
    p99 = pct([t for t, _ in two["beats"]], 99)
    met = rate >= 1 and p99 <= P99_TARGET_S
    print(f"PostgreSQL x2 vs SQLite x1: {rate:.2f}x the cycles/s, heartbeat p99 "
          f"{p99 / pct([t for t, _ in sqlite['beats']], 99):.2f}x ({ms(p99).strip()}); target (at least 1x the "
          f"cycles/s, heartbeat p99 <= {ms(P99_TARGET_S).strip()}): {'met' if met else 'NOT MET'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60, help="seconds of load a configuration (default 60)")
    parser.add_argument("--hosts", type=int, default=500, help=f"simulated hosts of {DEVICES_PER_HOST} devices "
                                                               "(default 500: 100 heartbeats/s)")
    parser.add_argument("--clients", type=int, default=4,
                        help="concurrent reserve/release clients (default 4; 0: heartbeats alone)")
    parser.add_argument("--postgres", default=os.environ.get(POSTGRES_ENV),
                        help=f"PostgreSQL admin URL (default: ${POSTGRES_ENV}, which bench/run sets)")
    args = parser.parse_args()
    configurations = CONFIGURATIONS if args.postgres else CONFIGURATIONS[:1]
    if not args.postgres:
        print(f"no PostgreSQL (--postgres or {POSTGRES_ENV}; bench/run starts one): SQLite only")
    results = {}
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as reserving:
        reserving.submit(ready).result()
        for kind, processes in configurations:
            results[f"{kind} x{processes}"] = run(kind, processes, args.postgres, args, reserving)
    report(results, args)


if __name__ == "__main__":
    main()
