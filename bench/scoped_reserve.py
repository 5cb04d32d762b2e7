"""Reserve + release with a scoped token, and a scoped and budgeted one, beside an unscoped one, in one run
(docs/architecture.md, "Shares of one lab": the scope is read with the token's row, parsed
once per distinct scope; a budget costs one conditional statement at the grant and one at
the end, most leases at once one more each).

A coordinator in this process (the app on this event loop, called through httpx's ASGI
transport: no sockets, so the figures are the coordinator's and its database's, which is
where a scope costs anything) with a fake exporter reporting 200 devices in 10 classes. Two
tokens of one person reserve by class and release, taking turns cycle by cycle (so that
whatever else the machine runs slows them alike), the reclaims completed every 20 cycles
(untimed): one unscoped; one scoped to every class, the tag every device has, two operations
and the longest lease (the scope check itself: no statement of its own); one scoped the same
with most leases at once and a budget of device-minutes a day too (room for the whole run: a
statement at the grant and one at the end, which no cache may spare — the budget is shared by
every coordinator process). Target: each scoped one at most 1.1x the unscoped one's time a
cycle. Also the statements each cycle costs (``Store.statements``).

Usage: bench/scoped_reserve.py [--devices 200] [--seconds 6] [--postgres ADMIN_URL]
(the admin URL defaults to DEVICE_LOOP_TEST_POSTGRES, which bench/run sets)
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

import tickets  # (bench/: the in-process lab of the queue's benchmark)

TARGET_RATIO = 1.1
SCOPED, BUDGETED, UNSCOPED = "scoped", "scoped+budget", "unscoped"


async def cycle_rates(admin_url: str | None, devices: int, seconds: float) -> dict:
    """Reserve + release cycles/s and statements a cycle, of each token."""
    from device_loop.coordinator.identity import issue_token
    from device_loop.core.scopes import TokenScope

    folder = Path(tempfile.mkdtemp(prefix="devloop-scoped-"))
    try:
        async with tickets.lab(admin_url, folder, devices) as the_lab:
            store, clock = the_lab.rules.store, the_lab.rules.clock
            scope = TokenScope(classes=tuple(tickets.class_of(k) for k in range(tickets.CLASSES)), tags=("sim",),
                               operations=("exec", "power.cycle"), max_lease_s=86400)
            budgeted = scope.model_copy(update={"max_leases": 100, "budget_s": 1_000_000})
            clients = {UNSCOPED: the_lab.client((await issue_token(store, clock, "bench"))["token"]),
                       SCOPED: the_lab.client((await issue_token(store, clock, "bench", scope=scope))["token"]),
                       BUDGETED: the_lab.client((await issue_token(store, clock, "bench", scope=budgeted))["token"])}
            try:
                timed, statements = dict.fromkeys(clients, 0.0), dict.fromkeys(clients, 0)
                n = 0
                while sum(timed.values()) < seconds:
                    for _ in range(tickets.BLOCK):
                        for kind, client in clients.items():
                            want = {"class": tickets.class_of(n % tickets.CLASSES), "ttl_s": 600}
                            before, started = store.statements, time.perf_counter()
                            lease = await client.post("/leases", json=want)
                            released = await client.post(f"/leases/{lease.json()['id']}/release")
                            timed[kind] += time.perf_counter() - started
                            statements[kind] += store.statements - before
                            if lease.status_code != 201 or released.status_code != 200:
                                raise SystemExit(f"{kind}: {lease.status_code} {lease.text} {released.text}")
                        n += 1
                    await the_lab.beat()  # the released devices are free again (untimed)
                return {kind: {"rate": n / timed[kind], "statements": statements[kind] / n, "cycles": n}
                        for kind in clients}
            finally:
                for client in clients.values():
                    await client.aclose()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=200, help="devices, in 10 classes (default 200)")
    parser.add_argument("--seconds", type=float, default=6, help="seconds of reserve cycles a database (default 6)")
    parser.add_argument("--postgres", default=os.environ.get(tickets.POSTGRES_ENV),
                        help=f"PostgreSQL admin URL (default: ${tickets.POSTGRES_ENV}, which bench/run sets)")
    args, _ = parser.parse_known_args()  # (bench/run hands every benchmark the same arguments)
    tickets._import()
    import logging

    logging.disable(logging.INFO)  # the coordinator's and httpx's own lines
    print(f"scoped reserve: {args.devices} devices, reserve by class + release, a scoped token, a scoped and "
          f"budgeted one and an unscoped one taking turns (in-process coordinator, no sockets); on {tickets.machine()}")
    met = True
    for kind, admin_url in [("SQLite", None)] + ([("PostgreSQL", args.postgres)] if args.postgres else []):
        rates = asyncio.run(cycle_rates(admin_url, args.devices, args.seconds))
        said = []
        for scoped in (SCOPED, BUDGETED):
            ratio = rates[UNSCOPED]["rate"] / rates[scoped]["rate"]  # its time a cycle, as a multiple
            ok = ratio <= TARGET_RATIO
            met = met and ok
            said.append(f"{scoped} {rates[scoped]['rate']:.0f} cycles/s ({rates[scoped]['statements']:.1f} statements)"
                        f": {ratio:.2f}x the unscoped time (target <= {TARGET_RATIO}x) {'met' if ok else 'NOT MET'}")
        print(f"  {kind}, {rates[UNSCOPED]['cycles']} cycles each: unscoped {rates[UNSCOPED]['rate']:.0f} cycles/s "
              f"({rates[UNSCOPED]['statements']:.1f} statements a cycle); " + "; ".join(said))
    if not met:
        print("  a target was NOT MET (above)")


if __name__ == "__main__":
    main()
