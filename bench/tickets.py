"""Queue tickets: how soon a device that turns idle is its next ticket's, what that grant
costs, and a reserve by class beside one by name, on SQLite and PostgreSQL, in one run
(docs/architecture.md, "Who gets the next lease").

A coordinator in this process (the app on this event loop, called through httpx's ASGI
transport: no sockets, so the figures are the coordinator's and its database's) with a
fake exporter reporting 200 devices in 10 classes of 20, tagged t0 or t1 by turns, and the
services of their leases up (as an exporter does once it started them).
People's tokens queue interactive tickets, agents' tokens batch ones.

1. Grant latency. Someone holds all 200 devices; 500 tickets are queued (50 a class: by
   class, by class and tag, by name; a third of them agents'), and each ticket's requester
   long-polls it (``GET /tickets/{id}?wait``). Then the devices are released one at a time:
   the time from sending the heartbeat that completes the reclaim (the device turns idle)
   to the long-poll answering with the ticket's lease (claimed) is measured, and that lease
   is released in its turn, until every ticket was served: p50, p99, max (also with >= 400
   tickets waiting and with < 100).
2. What that heartbeat costs, in statements (``Store.statements``) and time, with 500, 50
   and 1 tickets waiting (one of them granted), and with none (nothing granted): the same
   with a grant, whatever the queue's length (a grant costs a fixed number of statements,
   never one per waiting ticket or per device).
3. Reserve + release cycles/s, all devices free: by name (of five classes' devices), by
   class and by class and tag (of the five others), taking turns cycle by cycle (the
   reclaims complete every 20 cycles of each, untimed). Target: by class and tag at least
   0.8x by name.

Usage: bench/tickets.py [--devices 200] [--tickets 500] [--seconds 6] [--postgres ADMIN_URL]
(the admin URL defaults to DEVICE_LOOP_TEST_POSTGRES, which bench/run sets)
"""
from __future__ import annotations

import sys

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

POSTGRES_ENV = "DEVICE_LOOP_TEST_POSTGRES"
CLASSES = 10
TAGS = ("t0", "t1")
PEOPLE = [f"person{i}" for i in range(6)]
AGENTS = [f"agent{i}" for i in range(4)]
HOLDER = "holder"
BLOCK = 20           # reserve + release cycles of each kind before the reclaims complete
TARGET_RATIO = 0.8   # by class (and tag) against by name
WAITING = (0, 1, 50, 500)  # queue lengths at which a grant's heartbeat is counted (at most --tickets)
SAMPLES = 5                # heartbeats counted at each (3 x 5 grants: the 20 devices of one class suffice)

# what ``main`` imports (``_import``; see the top of the file): the coordinator and the client
httpx2: Any = None
create_app: Any = None
Settings: Any = None
issue_token: Any = None
TokenKind: Any = None
PROTOCOL_VERSION: Any = None
pct: Any = None
ms: Any = None


def _import() -> None:
    global httpx2, create_app, Settings, issue_token, TokenKind, PROTOCOL_VERSION, pct, ms
    import httpx2 as _httpx2

    from device_loop.coordinator.app import create_app as _create_app
    from device_loop.coordinator.identity import issue_token as _issue_token
    from device_loop.coordinator.rules import Settings as _Settings
    from device_loop.core import PROTOCOL_VERSION as _protocol
    from device_loop.core.vocabulary import TokenKind as _TokenKind
    from local_lab import ms as _ms, pct as _pct

    httpx2, create_app, Settings, issue_token, TokenKind = _httpx2, _create_app, _Settings, _issue_token, _TokenKind
    PROTOCOL_VERSION, pct, ms = _protocol, _pct, _ms


# ---- the lab ---------------------------------------------------------------------------------

def class_of(k: int) -> str:
    return f"class-{k}"


def device_names(devices: int) -> list[str]:
    """``devices`` names, the classes taking turns (c0-d0, c1-d0, ..., c9-d0, c0-d1, ...)."""
    per_class = devices // CLASSES
    return [f"c{k}-d{i}" for i in range(per_class) for k in range(CLASSES)]


class Exporter:
    """One host reporting every device, each of its class, tagged by turns, and a service up
    for each lease in ``serving`` (device -> lease id): what a real exporter reports once it
    started them. Bodies are encoded before they are timed."""

    def __init__(self, names: list[str]):
        self.boot, self.generation = uuid.uuid4().hex, 0
        self.devices = []
        self.ports = {name: 20000 + n for n, name in enumerate(names)}
        self.serving: dict[str, str] = {}
        for name in names:
            k, i = (int(part[1:]) for part in name.split("-"))  # c{k}-d{i}
            self.devices.append({"name": name, "class": class_of(k), "tags": ["sim", TAGS[i % 2]],
                                 "resources": [{"kind": "uart", "plugin": "sim", "identifier": f"bench:{name}"}]})

    def body(self) -> bytes:
        """The next report: every device present, the services of ``serving`` up, nothing else
        running (so the reclaim of every other device completes)."""
        self.generation += 1
        services = [{"lease": lease, "device": name, "identifier": f"bench:{name}", "kind": "uart",
                     "endpoints": [{"kind": "uart", "host": "127.0.0.1", "port": self.ports[name]}]}
                    for name, lease in sorted(self.serving.items())]
        return json.dumps({"protocol": PROTOCOL_VERSION, "version": "bench", "boot_id": self.boot,
                           "generation": self.generation, "heartbeat_s": 5.0, "devices": self.devices,
                           "services": services, "applied": sorted(self.serving.values())}).encode()


@contextlib.asynccontextmanager
async def database(admin_url: str | None, folder: Path):
    """A fresh database: a SQLite file in ``folder``, or one of its own on ``admin_url``'s server."""
    if admin_url is None:
        yield f"sqlite:///{folder / f'queue-{uuid.uuid4().hex[:6]}.sqlite'}"
        return
    import asyncpg

    name = f"queue_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
        yield f"{admin_url.rsplit('/', 1)[0]}/{name}"
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()


class Lab:
    """A coordinator app in this process, its people's and agents' clients, its exporter."""

    def __init__(self, app, names: list[str]):
        self.app, self.rules, self.names = app, app.state.rules, names
        self.exporter = Exporter(names)
        self.clients: dict[str, Any] = {}
        self.host: Any = None

    def client(self, token: str):
        return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=self.app, client=("127.0.0.1", 4321)),
                                  base_url="http://127.0.0.1/api/v1", timeout=120,
                                  headers={"Authorization": f"Bearer {token}"})

    async def start(self) -> None:
        store, clock = self.rules.store, self.rules.clock
        for name in [*PEOPLE, *AGENTS, HOLDER]:
            made = await issue_token(store, clock, name, kind=TokenKind.AGENT if name in AGENTS else TokenKind.PERSON)
            self.clients[name] = self.client(made["token"])
        self.host = self.client((await issue_token(store, clock, host="bench-host"))["token"])
        await self.beat()

    async def close(self) -> None:
        for c in [*self.clients.values(), self.host]:
            await c.aclose()

    async def beat(self, body: bytes | None = None) -> None:
        answer = await self.host.post("/hosts/bench-host/heartbeat", content=body or self.exporter.body(),
                                      headers={"Content-Type": "application/json"})
        if answer.status_code != 200:
            raise SystemExit(f"heartbeat: {answer.status_code} {answer.text}")

    async def post(self, who: str, path: str, body: dict | None = None) -> dict:
        answer = await self.clients[who].post(path, json=body or {}, headers={"Idempotency-Key": uuid.uuid4().hex})
        if answer.status_code >= 300:
            raise SystemExit(f"{who} POST {path} {body}: {answer.status_code} {answer.text}")
        return answer.json()

    async def hold(self, names: list[str]) -> list[dict]:
        """The holder reserves ``names``; the exporter starts their services (at its next report)."""
        leases = [await self.post(HOLDER, "/leases", {"device": n, "ttl_s": 86400}) for n in names]
        self.exporter.serving |= {lease["device"]: lease["id"] for lease in leases}
        return leases

    async def release(self, who: str, lease: dict) -> None:
        """``who`` releases ``lease``; the exporter stops its service (its next report says so)."""
        await self.post(who, f"/leases/{lease['id']}/release")
        self.exporter.serving.pop(lease["device"], None)

    def want(self, j: int, k: int) -> dict:
        """Ticket ``j``'s wish, of class ``k``: by class, by class and tag, or by name."""
        per_class = len(self.names) // CLASSES
        return [{"class": class_of(k)}, {"class": class_of(k)}, {"class": class_of(k)},
                {"class": class_of(k), "tags": [TAGS[j % 2]]}, {"device": f"c{k}-d{(j // CLASSES) % per_class}"}][j % 5]

    async def queue(self, j: int, k: int, any_device: bool = False) -> tuple[str, str]:
        """Ticket ``j`` of class ``k``: a third of them agents' (batch): (its id, its requester).
        (``any_device``: one that every device of the class would take, by class or by class
        and the tag they all have.)"""
        who = AGENTS[j % len(AGENTS)] if j % 3 == 0 else PEOPLE[j % len(PEOPLE)]
        want = {"class": class_of(k), "tags": ["sim"] if j % 2 else []} if any_device else self.want(j, k)
        answer = await self.post(who, "/leases", {**want, "queue": True, "ttl_s": 86400})
        if answer.get("state") != "waiting":
            raise SystemExit(f"ticket {j}: expected to wait, got {answer}")
        return answer["ticket"], who


@contextlib.asynccontextmanager
async def lab(admin_url: str | None, folder: Path, devices: int):
    async with database(admin_url, folder) as url:
        settings = Settings(reaper_interval_s=3600, max_leases_per_user=0, max_tickets_per_user=0,
                            image_dir=str(folder / "images"))  # (no reaper pass lands in a count)
        app = create_app(url, settings)
        async with app.router.lifespan_context(app):
            while app.state.rules.reap_passes == 0:  # the start's own pass
                await asyncio.sleep(0.005)
            the_lab = Lab(app, device_names(devices))
            await the_lab.start()
            try:
                yield the_lab
            finally:
                await the_lab.close()


# ---- 1. from idle to claimable ---------------------------------------------------------------

async def grant_latency(admin_url: str | None, folder: Path, devices: int, tickets: int) -> dict:
    async with lab(admin_url, folder, devices) as the_lab:
        names = the_lab.names
        held = [(lease, HOLDER) for lease in await the_lab.hold(names)]
        queued, queue_s = [], {"by name": [], "by class": []}  # how long queueing took, by what it asked for
        for j in range(tickets):
            started = time.perf_counter()
            queued.append(await the_lab.queue(j, j % CLASSES))
            queue_s["by name" if "device" in the_lab.want(j, 0) else "by class"].append(time.perf_counter() - started)
        claims: asyncio.Queue = asyncio.Queue()

        async def long_poll(ticket: str, who: str) -> None:
            while True:
                answer = await the_lab.clients[who].get(f"/tickets/{ticket}", params={"wait": 50})
                at = time.perf_counter()
                state = answer.json()["state"]
                if state == "claimed":
                    await claims.put((at, ticket, who, answer.json()["lease"]))
                    return
                if state != "waiting":
                    raise SystemExit(f"{ticket}: {answer.text}")

        polls = [asyncio.create_task(long_poll(t, who)) for t, who in queued]
        watched = the_lab.rules.life.notifier._events  # (the keys long-polls wait on)
        deadline = time.monotonic() + 60
        while len(watched) < tickets:  # until every long-poll waits
            if time.monotonic() > deadline:
                raise SystemExit(f"{len(watched)} of {tickets} long-polls are waiting after 60 s")
            await asyncio.sleep(0.01)
        samples, beats, idle_without_ticket, served = [], [], 0, 0
        await the_lab.beat()  # every held lease's service is up: active
        while held:
            lease, holder = held.pop(0)
            await the_lab.release(holder, lease)
            waiting = tickets - served
            body = the_lab.exporter.body()
            sent = time.perf_counter()
            await the_lab.beat(body)
            beats.append(time.perf_counter() - sent)
            facts = await the_lab.rules.devices.facts(lease["device"])
            if facts["lease_id"] is None:  # no ticket left that would take it
                idle_without_ticket += 1
                continue
            at, ticket, who, granted = await asyncio.wait_for(claims.get(), 30)
            if granted["device"] != lease["device"]:
                raise SystemExit(f"{ticket} was granted {granted['device']}, not the freed {lease['device']}")
            samples.append((at - sent, waiting))
            served += 1
            held.append((granted, who))
            the_lab.exporter.serving[granted["device"]] = granted["id"]  # up at the next report
        await asyncio.gather(*polls)
        if served != tickets:
            raise SystemExit(f"served {served} of {tickets} tickets")
        return {"samples": samples, "beats": beats, "queue_s": queue_s, "idle_without_ticket": idle_without_ticket}


# ---- 2. what the grant's heartbeat costs --------------------------------------------------------

def levels(tickets: int) -> list[int]:
    return sorted({min(n, tickets) for n in WAITING})


async def grant_costs(admin_url: str | None, folder: Path, devices: int, tickets: int) -> dict:
    """The heartbeat that completes a reclaim, with ``levels`` of tickets waiting for the
    device's class (the first of them granted it; none: nothing granted), ``SAMPLES`` times
    each: {waiting: (its statements each time, its seconds each time)}."""
    async with lab(admin_url, folder, devices) as the_lab:
        store = the_lab.rules.store
        held = await the_lab.hold([n for n in the_lab.names if n.startswith("c0-")])
        costs: dict[int, tuple[list[int], list[float]]] = {}
        waiting, j = 0, 0
        samples = max(1, min(SAMPLES, (len(held) - 1) // 3))  # each level with a ticket takes that many devices
        for target in levels(tickets):
            costs[target] = ([], [])
            for _ in range(samples):
                while waiting < target:
                    await the_lab.queue(j, 0, any_device=True)
                    j, waiting = j + 1, waiting + 1
                await the_lab.beat()  # what the last round granted or held is active: only the grant counts
                freed = held.pop(0)
                await the_lab.release(HOLDER, freed)
                body = the_lab.exporter.body()
                before, started = store.statements, time.perf_counter()
                await the_lab.beat(body)
                costs[target][1].append(time.perf_counter() - started)
                costs[target][0].append(store.statements - before)
                if target:
                    waiting -= 1  # granted to the first of them
                    granted = await the_lab.rules.devices.facts(freed["device"])
                    the_lab.exporter.serving[freed["device"]] = granted["lease_id"]
                else:
                    held += await the_lab.hold([freed["device"]])  # nothing took it: held again
        return costs


# ---- 3. reserve by name, by class, by class and tag -----------------------------------------------

async def reserve_rates(admin_url: str | None, folder: Path, devices: int, seconds: float) -> dict:
    """Reserve + release cycles/s of each kind, the kinds taking turns cycle by cycle (so that
    whatever else the machine runs slows them alike), the reclaims completed every ``BLOCK``
    cycles of each (untimed)."""
    async with lab(admin_url, folder, devices) as the_lab:
        half = CLASSES // 2  # reserves by name take the first half of the classes, by class the others
        names = [n for n in the_lab.names if int(n[1:n.index("-")]) < half]
        wants = {"by name": lambda n: {"device": names[n % len(names)]},
                 "by class": lambda n: {"class": class_of(half + n % half)},
                 "by class + tag": lambda n: {"class": class_of(half + n % half), "tags": [TAGS[n // half % 2]]}}
        timed = dict.fromkeys(wants, 0.0)
        n = 0
        while sum(timed.values()) < seconds:
            for _ in range(BLOCK):
                for kind, want in wants.items():
                    started = time.perf_counter()
                    lease = await the_lab.post(HOLDER, "/leases", {**want(n), "ttl_s": 600})
                    await the_lab.post(HOLDER, f"/leases/{lease['id']}/release")  # (pending: nothing served)
                    timed[kind] += time.perf_counter() - started
                n += 1
            await the_lab.beat()  # the released devices are free again (untimed)
        return {kind: n / timed[kind] for kind in wants}


# ---- report ------------------------------------------------------------------------------------------

def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown CPU")
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    return f"{platform.node()}: {os.cpu_count()} x {model}, Python {platform.python_version()}, load average {load}"


def report(kind: str, latency: dict, costs: dict, rates: dict, took: dict, args) -> bool:
    samples = [s for s, _ in latency["samples"]]
    many, few = round(args.tickets * 0.8), round(args.tickets * 0.2)
    full = [s for s, waiting in latency["samples"] if waiting >= many]
    short = [s for s, waiting in latency["samples"] if waiting < few]
    print(f"  {kind}")
    print(f"    device idle -> its ticket's lease claimable: {len(samples)} grants, "
          f"p50 {ms(pct(samples, 50)).strip()}, p99 {ms(pct(samples, 99)).strip()}, "
          f"max {ms(max(samples)).strip()}; p50 with >= {many} waiting "
          f"{ms(pct(full, 50)).strip()}, with < {few} {ms(pct(short, 50)).strip()}; the heartbeat's own answer "
          f"p50 {ms(pct(latency['beats'], 50)).strip()}")
    print("    queueing a ticket took (p50) " + ", ".join(f"{ms(pct(v, 50)).strip()} {k}" for k, v in
                                                  latency["queue_s"].items() if v)
          + f"; {latency['idle_without_ticket']} devices turned idle with no ticket left for them")
    with_grant = {c for n in levels(args.tickets) if n for c in costs[n][0]}
    print("    the heartbeat that completes a reclaim (time: median): " + ", ".join(
        f"{n} waiting {'/'.join(map(str, sorted(set(costs[n][0]))))} statements "
        f"({ms(statistics.median(costs[n][1])).strip()})" for n in reversed(levels(args.tickets)))
          + f" -> a grant costs {'a fixed' if len(with_grant) == 1 else 'a VARYING'} number: "
          f"{'/'.join(str(c - min(costs[0][0])) for c in sorted(with_grant))} statements over nothing waiting")
    ratio = rates["by class + tag"] / rates["by name"]
    print("    reserve + release cycles/s: " + ", ".join(f"{k} {v:.0f}" for k, v in rates.items())
          + f"; by class / by name {rates['by class'] / rates['by name']:.2f}x, by class + tag / by name "
          f"{ratio:.2f}x (target >= {TARGET_RATIO}x: {'met' if ratio >= TARGET_RATIO else 'NOT MET'})")
    print("    (" + ", ".join(f"{k} {v:.0f} s" for k, v in took.items()) + ")")
    return len(with_grant) == 1 and ratio >= TARGET_RATIO


async def run(admin_url: str | None, args) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="devloop-queue-"))
    try:
        results, took = {}, {}
        for key, phase in (("latency", lambda: grant_latency(admin_url, folder, args.devices, args.tickets)),
                           ("costs", lambda: grant_costs(admin_url, folder, args.devices, args.tickets)),
                           ("rates", lambda: reserve_rates(admin_url, folder, args.devices, args.seconds))):
            started = time.perf_counter()
            results[key] = await phase()
            took[key] = time.perf_counter() - started
        return {**results, "took": took}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=200, help="devices, in 10 classes (default 200)")
    parser.add_argument("--tickets", type=int, default=500, help="tickets queued (default 500)")
    parser.add_argument("--seconds", type=float, default=6, help="seconds of reserve cycles a database (default 6)")
    parser.add_argument("--postgres", default=os.environ.get(POSTGRES_ENV),
                        help=f"PostgreSQL admin URL (default: ${POSTGRES_ENV}, which bench/run sets)")
    args, _ = parser.parse_known_args()  # (bench/run hands every benchmark the same arguments)
    _import()
    import logging

    logging.disable(logging.INFO)  # the coordinator's and httpx's own lines
    print(f"queue: {args.devices} devices in {CLASSES} classes, {args.tickets} tickets waiting "
          f"(in-process coordinator, no sockets); on {machine()}")
    if not args.postgres:
        print(f"  no PostgreSQL (--postgres or {POSTGRES_ENV}; bench/run starts one): SQLite only")
    met = True
    for kind, admin_url in [("SQLite", None)] + ([("PostgreSQL", args.postgres)] if args.postgres else []):
        results = asyncio.run(run(admin_url, args))
        met = report(kind, results["latency"], results["costs"], results["rates"], results["took"], args) and met
    if not met:
        print("  a target was NOT MET (above)")


if __name__ == "__main__":
    main()
