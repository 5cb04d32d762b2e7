"""Property tests against the live API: two real coordinator processes on one PostgreSQL,
each request through either of them, while time really passes (leases renewed to 1 s
expire under the reapers of both processes, in the middle of whatever else goes on).

Whatever clients and an exporter do, in any order:

- a device has at most one live lease, and the board shows its holder;
- every lease ends once, in one final state, and never leaves it; it expires only once
  its time ran out, and is released only by its holder;
- no endpoint is shown for a lease that is not live, and the endpoints shown are those of
  the host's newest report;
- a stale, duplicate or superseded heartbeat changes nothing, and of two reports racing
  through the two processes the newer one's state stays (never rolled back);
- the lab settles: once the leases are released and the exporter runs nothing, every
  device is idle.
"""
import asyncio
import functools
import itertools
import os
import time
from collections import Counter
from dataclasses import dataclass

import httpx2
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from conftest import wait_for
from device_loop.core.durations import parse_iso
from lab_in_process import FakeExporter, device
from live_lab import END_ACTIONS, FINAL, LIVE, LabDatabase, LiveExporter, Spread, service

pytestmark = pytest.mark.timeout(180)

USERS = ("alice", "bob")
VIA = st.integers(0, 1)  # the coordinator process a request goes through
ALLOCATING_TIMEOUT_S = 30.0  # the coordinators' default: a lease pending longer fails
EXAMPLES = itertools.count()  # each example has devices, a host and users of its own


def as_reported(endpoints: list[dict]) -> list[dict]:
    """A lease's endpoints as its host reported them: without what the coordinator adds to
    each (the part of the data plane it is, its gate's secret)."""
    return [{k: v for k, v in e.items() if k not in ("scope", "secret")} for e in endpoints]


@dataclass
class Known:
    """What the test knows of a lease it was granted."""
    id: str
    device: str
    user: str                   # "alice" or "bob"
    short: bool = False         # renewed to a 1 s ttl at some point
    expiring: bool = False      # ... and not renewed since: it may end at any moment
    released: bool = False      # its holder asked for its release
    final: tuple | None = None  # (state, ended_at, end_reason), once seen ended


def differences(before: dict, after: dict) -> list[str]:
    """What changed between two database snapshots, row by row."""
    out = []
    for table in before:
        old, new = before[table], after[table]
        out += [f"{table}: {a} -> {b}" for a, b in zip(old, new) if a != b]
        out += [f"{table}: new row {row}" for row in new[len(old):]] + [f"{table}: lost {row}" for row in old[len(new):]]
    return out


class LiveLab(RuleBasedStateMachine):
    """Two users, two devices on one host, a lab of two coordinator processes."""

    spread: Spread      # set by the test
    db: LabDatabase

    def __init__(self):
        super().__init__()
        n = next(EXAMPLES)
        self.names = {user: f"{user}-{n}" for user in USERS}
        self.devices = [f"x{n}-b0", f"x{n}-b1"]
        self.exporter = LiveExporter(self.spread, f"h{n}")
        self.leases: dict[str, Known] = {}
        self.published: dict[str, list] = {}  # lease -> the endpoints the newest report gave it
        self.online = True
        self.newest = 0                       # the generation of this boot's newest accepted report
        self.old_boot: dict | None = None     # the newest report of the boot a restart replaced
        self.ports = itertools.count(20000)
        self._accepted(self.exporter.beat(0, self.devices), self.exporter.sent[-1])

    # ---- helpers ------------------------------------------------------------------------

    def call(self, via: int, user: str, method: str, path: str, **kwargs):
        return self.spread.request(via, method, path, user=self.names[user], **kwargs)

    def pick(self, index: int) -> Known | None:
        return list(self.leases.values())[index % len(self.leases)] if self.leases else None

    def expiring(self) -> list[Known]:
        return [k for k in self.leases.values() if k.expiring and k.final is None]

    def device_row(self, name: str) -> dict:
        """The device's stored state with its live lease (``lease``, ``holder``), if any."""
        (row,) = self.db.rows(
            "SELECT d.name, d.state, l.id AS lease, l.holder FROM devices d LEFT JOIN leases l "
            "ON l.device = d.name AND l.state = ANY($2::text[]) WHERE d.name = $1", name, list(LIVE))
        return row

    def live_ids(self) -> set[str]:
        return {r["id"] for r in self.db.rows("SELECT id FROM leases WHERE device = ANY($1::text[]) AND "
                                              "state = ANY($2::text[])", self.devices, list(LIVE))}

    def services_for(self, via: int, present: list[str]) -> list[dict]:
        """Services up for what the desired state asks on ``present`` devices, each on a new port."""
        return [service(s["lease"], s["device"], s["identifier"], next(self.ports))
                for s in self.exporter.desired(via)["services"] if s["device"] in present]

    def _accepted(self, response, body: dict) -> None:
        """The coordinator took ``body`` (answered ``response``): it is the host's newest report."""
        assert response.status_code == 200, response.text
        self.newest = body["generation"]
        self.published = {s["lease"]: s["endpoints"] for s in body["services"]}
        self.online = not body["stopping"]

    def _record_reserve(self, user: str, name: str, before: dict, response) -> None:
        """Check a reserve's answer against what held the device before it."""
        holding = before["lease"]
        if response.status_code == 201:
            lease = response.json()
            assert (lease["holder"], lease["device"], lease["state"], lease["endpoints"]) == \
                   (self.names[user], name, "pending", []), lease
            assert holding is None or self.leases[holding].expiring, f"{name} granted while {holding} held it"
            self.leases[lease["id"]] = Known(lease["id"], name, user)
            return
        assert response.status_code == 409, response.text
        if holding is None:
            assert before["state"] != "idle", f"{name} was idle and free, yet refused: {response.text}"
        elif not self.leases[holding].expiring:
            mine = before["holder"] == self.names[user]
            assert response.json()["error"] == ("already_yours" if mine else "busy"), response.text

    # ---- clients ------------------------------------------------------------------------

    @rule(user=st.sampled_from(USERS), which=st.integers(0, 1), ttl=st.sampled_from([60, 600]), via=VIA)
    def reserve(self, user, which, ttl, via):
        name = self.devices[which]
        before = self.device_row(name)
        response = self.call(via, user, "POST", "/leases", json={"device": name, "ttl_s": ttl})
        self._record_reserve(user, name, before, response)

    @rule(which=st.integers(0, 1))
    def contend(self, which):
        """Both users reserve one device at the same moment, each through another process."""
        name = self.devices[which]
        before = self.device_row(name)
        answers = self.spread.at_once(*((functools.partial(self.call, via, user, "POST", "/leases",
                                                           json={"device": name}),)
                                        for via, user in enumerate(USERS)))
        granted = [a for a in answers if a.status_code == 201]
        assert len(granted) <= 1, f"{name} granted twice: {[a.json() for a in granted]}"
        if before["lease"] is None and before["state"] == "idle":
            assert len(granted) == 1, [a.text for a in answers]
        for user, answer in zip(USERS, answers):
            if answer.status_code == 201:
                self.leases[answer.json()["id"]] = Known(answer.json()["id"], name, user)
            else:
                assert answer.status_code == 409, answer.text

    @rule(user=st.sampled_from(USERS), pick=st.integers(0, 20), ttl=st.sampled_from([60, 600]), via=VIA)
    def renew(self, user, pick, ttl, via):
        known = self.pick(pick)
        if known is None:
            return
        response = self.call(via, user, "POST", f"/leases/{known.id}/renew", json={"ttl_s": ttl})
        if user != known.user:
            assert response.status_code == 404, response.text
        elif known.final is not None:
            assert (response.status_code, response.json()["error"]) == (409, "lease_ended"), response.text
        elif response.status_code == 200:
            assert abs(parse_iso(response.json()["expires_at"]) - (time.time() + ttl)) < 10, response.json()
            known.expiring = False
        else:
            assert known.expiring and response.json()["error"] == "lease_ended", response.text

    @rule(pick=st.integers(0, 20), via=VIA)
    def expire_soon(self, pick, via):
        """Its holder renews it to 1 s: the reapers end it while the example goes on."""
        known = self.pick(pick)
        if known is None:
            return
        response = self.call(via, known.user, "POST", f"/leases/{known.id}/renew", json={"ttl_s": 1})
        if response.status_code == 200:
            known.short = known.expiring = True
        else:
            assert known.final is not None or known.expiring, response.text
            assert response.json()["error"] == "lease_ended", response.text

    @rule()
    def wait_for_expiry(self):
        """Time passes until the leases renewed to 1 s ended; a running exporter reports meanwhile."""
        if not self.expiring():
            return
        def ended():
            live = self.live_ids()
            return not any(k.id in live for k in self.expiring())
        wait_for(ended, interval=0.1, what="leases renewed to 1 s to expire")
        if self.online:  # the same as its newest report, a generation later (else it would go silent)
            newest = next(b for b in self.exporter.sent if b["generation"] == self.newest)
            self._accepted(self.exporter.beat(0, [d["name"] for d in newest["devices"]], newest["services"]),
                           self.exporter.sent[-1])

    @rule(user=st.sampled_from(USERS), pick=st.integers(0, 20), via=VIA)
    def release(self, user, pick, via):
        known = self.pick(pick)
        if known is None:
            return
        response = self.call(via, user, "POST", f"/leases/{known.id}/release")
        if user != known.user:
            assert response.status_code == 404, response.text
            return
        assert response.status_code == 200, response.text
        known.released = True
        answer = response.json()
        assert answer["endpoints"] == [] and not answer["ready"], answer
        if known.final is not None:
            assert answer["state"] == known.final[0], answer
        else:
            assert answer["state"] in (("released", "expired") if known.expiring else ("released",)), answer

    # ---- the exporter -------------------------------------------------------------------

    @rule(mode=st.sampled_from(["serve", "idle", "unplug"]), via=VIA)
    def heartbeat(self, mode, via):
        """A new report: services up for what the desired state asks ("serve"), nothing
        running ("idle"), or device b1 gone and b0 served ("unplug")."""
        live_before = self.live_ids()
        present = self.devices[:1] if mode == "unplug" else self.devices
        services = [] if mode == "idle" else self.services_for(via, present)
        response = self.exporter.beat(via, present, services)
        self._accepted(response, self.exporter.sent[-1])
        asked = {s["lease"] for s in response.json()["services"]}
        assert asked <= live_before, f"the desired state names leases that are not live: {asked - live_before}"
        if mode == "serve":
            for served in services:
                known = self.leases[served["lease"]]
                view = self.call(via, known.user, "GET", f"/leases/{known.id}").json()
                if view["state"] in LIVE:
                    assert view["ready"] and as_reported(view["endpoints"]) == served["endpoints"], view
        if mode != "unplug" and not self.expiring():
            for name in self.devices:
                row = self.device_row(name)
                assert row["lease"] is not None or row["state"] == "idle", \
                    f"{name} is {row['state']} though its exporter reported it runs nothing for an ended lease"

    @rule(kind=st.sampled_from(["stale", "duplicate", "superseded"]), pick=st.integers(0, 20), via=VIA)
    def replay(self, kind, pick, via):
        """A report sent again: an older generation of this boot, the newest one twice, or
        the newest of the boot a restart replaced. It must change nothing."""
        if self.expiring():
            return  # a reaper could change the lab meanwhile
        if kind == "stale":
            older = [b for b in self.exporter.sent if b["generation"] < self.newest]
            if not older:
                return
            body, expected = older[pick % len(older)], (409, "stale_heartbeat")
        elif kind == "duplicate":
            body, expected = next(b for b in self.exporter.sent if b["generation"] == self.newest), (200, None)
        else:
            if self.old_boot is None or not self.online:
                return  # (a replaced boot may take over once its successor went away)
            body, expected = self.old_boot, (409, "superseded_boot")
        before = self.db.snapshot(self.exporter.name, self.devices)
        response = self.exporter.post(via, body)
        after = self.db.snapshot(self.exporter.name, self.devices)
        assert (response.status_code, response.json().get("error")) == expected, \
            f"a {kind} report (generation {body['generation']}, newest {self.newest}) got {response.text}"
        assert after == before, f"a {kind} report (generation {body['generation']}, newest {self.newest}) " \
                                f"changed the lab: {differences(before, after)}"
        if kind == "duplicate":
            assert response.json()["services"] == self.exporter.desired(via)["services"]

    @rule(older_via=VIA, newer_first=st.booleans(), older_unplugs=st.booleans(), lag=st.sampled_from([0, 0.003, 0.02]))
    def racing_reports(self, older_via, newer_first, older_unplugs, lag):
        """Generations N and N+1 posted at once through the two processes (one of them
        ``lag`` seconds late): the newest taken stays, whatever order they land in."""
        older_present = self.devices[:1] if older_unplugs else self.devices
        older = self.exporter.body(older_present, self.services_for(older_via, older_present))
        newer = self.exporter.body(self.devices, self.services_for(1 - older_via, self.devices))

        def send(via, body, delay):
            time.sleep(delay)  # the lag is what the rule varies: which report lands first (no synchronisation)
            return self.exporter.post(via, body)
        old_answer, new_answer = self.spread.at_once((send, older_via, older, lag if newer_first else 0),
                                                     (send, 1 - older_via, newer, 0 if newer_first else lag))
        assert new_answer.status_code == 200 or new_answer.json()["error"] == "concurrent_update", new_answer.text
        assert old_answer.status_code == 200 or \
               old_answer.json()["error"] in ("stale_heartbeat", "concurrent_update"), old_answer.text
        winner, answer = (newer, new_answer) if new_answer.status_code == 200 else (older, old_answer)
        if answer.status_code != 200:
            return  # both refused: the invariants say nothing changed
        self._accepted(answer, winner)
        (host,) = self.db.rows("SELECT generation FROM hosts WHERE name = $1", self.exporter.name)
        present = {r["name"] for r in self.db.rows("SELECT name FROM devices WHERE name = ANY($1::text[]) AND present",
                                                   self.devices)}
        assert host["generation"] == self.newest, \
            f"generations {older['generation']} and {newer['generation']} answered {old_answer.status_code} and " \
            f"{new_answer.status_code}, and the host is at generation {host['generation']}: rolled back"
        assert present == {d["name"] for d in winner["devices"]}, "a report older than the newest was applied"

    @rule(how=st.sampled_from(["crash", "stop", "stop and start"]), via=VIA)
    def restart(self, how, via):
        """The exporter stops (its last report says so: no services, the host goes
        offline), starts again (a new boot id, nothing running yet), or both."""
        if how.startswith("stop"):
            self._accepted(self.exporter.beat(via, self.devices, stopping=True), self.exporter.sent[-1])
        if how != "stop":
            self.old_boot = next(b for b in self.exporter.sent if b["generation"] == self.newest)
            self.exporter.reboot()
            self._accepted(self.exporter.beat(via, self.devices), self.exporter.sent[-1])

    # ---- after every step -----------------------------------------------------------------

    @invariant()
    def lab_is_consistent(self):
        rows = {r["id"]: r for r in self.db.rows("SELECT * FROM leases WHERE device = ANY($1::text[])", self.devices)}
        assert rows.keys() == self.leases.keys(), "a lease nobody was granted, or a granted lease is gone"
        live = {}
        for lease_id, row in rows.items():
            known = self.leases[lease_id]
            assert (row["device"], row["holder"]) == (known.device, self.names[known.user]), row
            if row["state"] in LIVE:
                assert known.final is None, f"{lease_id} left its final state {known.final} for {row['state']}"
                assert row["ended_at"] is None and row["end_reason"] is None, row
                assert row["device"] not in live, f"two live leases on {row['device']}"
                live[row["device"]] = row
            else:
                self._check_ending(known, row)
        ends = Counter(r["lease_id"] for r in self.db.rows(
            "SELECT lease_id FROM audit WHERE device = ANY($1::text[]) AND action = ANY($2::text[])",
            self.devices, list(END_ACTIONS)))
        for lease_id, row in rows.items():
            allowed = {1} if row["state"] in FINAL else ({0, 1} if self.leases[lease_id].expiring else {0})
            assert ends[lease_id] in allowed, f"{lease_id} ({row['state']}) ended {ends[lease_id]} times"
        (host,) = self.db.rows("SELECT boot_id, generation, online FROM hosts WHERE name = $1", self.exporter.name)
        assert (host["boot_id"], host["generation"]) == (self.exporter.boot_id, self.newest), \
            f"the host's state is not that of its newest report: {host}"
        assert host["online"] == self.online, host

        for n, (lease_id, known) in enumerate(self.leases.items()):
            view = self.call(n, known.user, "GET", f"/leases/{lease_id}").json()
            if rows[lease_id]["state"] not in LIVE:
                assert view["state"] == rows[lease_id]["state"], view
            elif view["state"] not in LIVE:
                assert known.expiring and view["state"] == "expired", view
            if view["state"] in LIVE:
                shown = self.published.get(lease_id, []) if self.online else []
                assert as_reported(view["endpoints"]) == shown, \
                    f"{lease_id} shows {view['endpoints']}, its host reported {shown}"
            else:
                assert view["endpoints"] == [] and not view["ready"], f"an ended lease shows endpoints: {view}"
            if view["ready"]:
                assert view["state"] == "active" and view["endpoints"] and view["device_state"] == "in_use", view

        asked = {s["lease"] for s in self.exporter.desired(len(rows))["services"]}
        assert asked <= {row["id"] for row in live.values()}, "the desired state names leases that are not live"
        for n, name in enumerate(self.devices):
            board = self.call(n, "alice", "GET", f"/devices/{name}").json()
            row = live.get(name)
            if row is None:
                assert board["holder"] is None, board
            elif not self.leases[row["id"]].expiring:
                assert board["holder"] == row["holder"], board
                assert board["state"] in ("allocating", "in_use", "offline"), board

    def _check_ending(self, known: Known, row: dict) -> None:
        """An ended lease: one final state, for a reason the test caused, and kept as it is."""
        ending = (row["state"], row["ended_at"], row["end_reason"])
        assert row["state"] in FINAL and row["ended_at"] is not None and row["secret"] is None, row
        if known.final is not None:
            assert ending == known.final, f"{known.id} changed after it ended: {known.final} -> {ending}"
            return
        if row["state"] == "expired":
            assert known.short, f"{known.id} expired though its ttl was never shorter than a minute: {row}"
            assert row["ended_at"] >= row["expires_at"], \
                f"{known.id} expired at {row['ended_at']:.3f}, before its expiry {row['expires_at']:.3f} " \
                f"(a renewal answered 200 was lost)"
        elif row["state"] == "released":
            assert known.released, f"{known.id} was released though its holder never asked: {row}"
        else:
            assert row["state"] == "failed" and row["ended_at"] - row["created_at"] >= ALLOCATING_TIMEOUT_S, row
        known.final, known.expiring = ending, False

    def teardown(self):
        """Release every lease; once the exporter reports it runs nothing, all is idle."""
        for n, known in enumerate(self.leases.values()):
            assert self.call(n, known.user, "POST", f"/leases/{known.id}/release").status_code == 200
        self.exporter.beat(0, self.devices)
        states = {name: self.call(1, "alice", "GET", f"/devices/{name}").json()["state"] for name in self.devices}
        assert states == dict.fromkeys(self.devices, "idle"), states


# No shrinking: each replay of a live lab runs for real (and may take another turn), so a
# failure is reported as it was found, a sequence of at most 30 steps, within the timeout.
# (No preconditions either: which rules may run must not depend on timing, or hypothesis
# finds its own data generation inconsistent; a rule with nothing to do returns.)
SETTINGS = settings(max_examples=10, stateful_step_count=30, deadline=None, derandomize=bool(os.environ.get("CI")),
                    phases=[Phase.explicit, Phase.reuse, Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow])


def test_the_lease_rules_hold_on_the_live_api(two_coordinators, postgres_database):
    spread, db = Spread(two_coordinators), LabDatabase(postgres_database)
    LiveLab.spread, LiveLab.db = spread, db
    try:
        run_state_machine_as_test(LiveLab, settings=SETTINGS)
    finally:
        spread.close()
        db.close()


async def wait_for_a_stalled_reaper(database_url: str, timeout: float = 15.0) -> None:
    """Wait until a coordinator's reaper waits for a row lock to end a lease."""
    import asyncpg

    watcher = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + timeout
        while not await watcher.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE 'UPDATE leases SET state%'"):
            assert time.monotonic() < deadline, "no reaper pass came to end the overdue leases"
            await asyncio.sleep(0.05)  # (polling the condition)
    finally:
        await watcher.close()


async def wait_until_answered_or_waiting_for_a_row(database_url: str, requests: list[asyncio.Task],
                                                   timeout: float = 15.0) -> None:
    """Wait until each renewal of ``requests`` was answered, or its UPDATE waits for a row
    lock (one the stalled reaper holds: it cannot be answered before that pass ends)."""
    import asyncpg

    watcher = await asyncpg.connect(database_url)  # (not in a transaction: each query sees activity anew)
    try:
        deadline = time.monotonic() + timeout
        while True:
            waiting = await watcher.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE 'UPDATE leases SET expires_at%'")
            answered = sum(request.done() for request in requests)
            if answered + waiting >= len(requests):
                return
            assert time.monotonic() < deadline, \
                f"of {len(requests)} renewals {answered} were answered and {waiting} wait for a row"
            await asyncio.sleep(0.02)  # (polling the condition)
    finally:
        await watcher.close()


@pytest.mark.anyio
async def test_a_renewal_answered_200_is_never_lost_to_the_reaper(two_coordinators, postgres_database):
    """A renewal answered 200 keeps its lease live until its new expiry, even when it comes
    while a reaper is ending the overdue leases. To hold that pass open, the test keeps the
    row of one overdue lease locked, as a slow statement would, while the holders of ten
    others renew them through both processes; then lets go."""
    import asyncpg

    clients = [httpx2.AsyncClient(base_url=f"{c.url}/api/v1", timeout=60) for c in two_coordinators]
    names = [f"r{i}" for i in range(11)]
    holder = await asyncpg.connect(postgres_database)
    try:
        assert (await FakeExporter(clients[0], "host-r").beat([device(n) for n in names])).status_code == 200
        granted = await asyncio.gather(*(clients[i % 2].post("/leases", json={"device": name, "ttl_s": 1},
                                                             headers={"X-Device-Loop-User": f"u-{name}"})
                                         for i, name in enumerate(names)))
        assert all(r.status_code == 201 for r in granted), [r.text for r in granted]
        leases = {r.json()["id"]: r.json() for r in granted}
        last = await holder.fetchval("SELECT id FROM leases WHERE id = ANY($1::text[]) ORDER BY expires_at DESC "
                                     "LIMIT 1", list(leases))  # the last to be overdue: a pass that has it has all
        held, renewed = leases.pop(last), list(leases.values())
        held_row = holder.transaction()
        await held_row.start()
        await holder.execute("SELECT id FROM leases WHERE id = $1 FOR UPDATE", held["id"])
        await wait_for_a_stalled_reaper(postgres_database)

        renewals = [asyncio.create_task(clients[i % 2].post(f"/leases/{lease['id']}/renew", json={"ttl_s": 600},
                                                            headers={"X-Device-Loop-User": lease["holder"]}))
                    for i, lease in enumerate(renewed)]
        await wait_until_answered_or_waiting_for_a_row(postgres_database, renewals)
        await held_row.commit()
        answers = await asyncio.gather(*renewals)
        lost = []
        for lease, answer in zip(renewed, answers):
            now = (await clients[0].get(f"/leases/{lease['id']}", headers={"X-Device-Loop-User": lease["holder"]})).json()
            if answer.status_code == 200 and now["state"] not in LIVE:
                audit = await holder.fetch("SELECT action FROM audit WHERE lease_id = $1 ORDER BY id", lease["id"])
                lost.append({"id": lease["id"], "renewed_until": answer.json()["expires_at"], "state": now["state"],
                             "ended_at": now["ended_at"], "audit": [a["action"] for a in audit]})
            elif answer.status_code != 200:
                assert answer.json()["error"] == "lease_ended" and now["state"] == "expired", (answer.text, now)
    finally:
        await holder.close()
        for client in clients:
            await client.aclose()
    assert not lost, f"{len(lost)} of {sum(a.status_code == 200 for a in answers)} renewals answered 200 were " \
                     f"lost, the lease ended all the same: {lost}"


def test_reports_racing_through_two_processes_never_roll_the_host_back(two_coordinators, postgres_database):
    """Generations N and N+1 of one boot posted through the two processes, 50 ms apart in
    either order, N+1 twice at once (a duplicate, through both): after each round the host is at
    N+1 with N+1's devices and endpoints, and a device changed state only as often as the
    reports taken in generation order say."""
    spread, db = Spread(two_coordinators), LabDatabase(postgres_database)
    exporter = LiveExporter(spread, "host-o")
    names = ["o0", "o1"]
    try:
        exporter.beat(0, names)
        leases = [spread.request(n, "POST", "/leases", json={"device": name}).json() for n, name in enumerate(names)]
        ports = itertools.count(30000)

        def serving(present):
            return [service(lease["id"], lease["device"], f"sim:{lease['device']}", next(ports))
                    for lease in leases if lease["device"] in present]
        exporter.beat(1, names, serving(names))
        (seq_before,) = db.rows("SELECT log_seq FROM devices WHERE name = 'o1'")
        flaps = stale = 0
        for round_ in range(30):
            via, newer_first = round_ % 2, round_ % 4 < 2
            older = exporter.body(names[:1], serving(names[:1]))  # N: o1 unplugged
            newer = exporter.body(names, serving(names))           # N+1: o1 back

            def send(to, body, delay):
                time.sleep(delay)  # the order the reports land in is what the rounds vary (no synchronisation)
                return exporter.post(to, body)
            late, early = 0.05, 0.0
            old, new, again = spread.at_once((send, via, older, late if newer_first else early),
                                             (send, 1 - via, newer, early if newer_first else late),
                                             (send, via, newer, early if newer_first else late))
            assert new.status_code == again.status_code == 200, (new.text, again.text)
            assert old.status_code == 200 or old.json()["error"] == "stale_heartbeat", old.text
            stale += old.status_code == 409
            flaps += old.status_code == 200 and not newer_first  # o1 went offline, then came back
            (host,) = db.rows("SELECT generation FROM hosts WHERE name = 'host-o'")
            assert host["generation"] == newer["generation"], f"round {round_}: rolled back to {host}, " \
                                                              f"answers {old.status_code}, {new.status_code}"
            for n, lease in enumerate(leases):
                view = spread.request(n + round_, "GET", f"/leases/{lease['id']}").json()
                shown = next(s["endpoints"] for s in newer["services"] if s["lease"] == lease["id"])
                assert view["ready"] and as_reported(view["endpoints"]) == shown, f"round {round_}: {view}"
        (seq_after,) = db.rows("SELECT log_seq FROM devices WHERE name = 'o1'")
        assert seq_after["log_seq"] - seq_before["log_seq"] <= 2 * flaps, \
            "o1 changed state more often than the reports taken in order made it"
        assert stale, "no round had the older report arrive last: the race was not run"
    finally:
        spread.close()
        db.close()
