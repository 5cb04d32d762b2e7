"""Queue tickets on the live API (docs/architecture.md, "Who gets the next lease"): two real
coordinator processes on one PostgreSQL, each request through either of them, a class of
five devices on one (fake) exporter host.
People queue through REST (interactive tickets), agents through MCP (batch ones); tickets
are claimed (their requester reads them), cancelled, their leases released, and the
exporter's heartbeats complete the reclaims, while the reapers of both processes run.

Whatever happens, in any order, read from the database in one snapshot after every step:

- a device has at most one live lease, its leases never overlap in time, and it is
  allocating or in use exactly while one lives (unless it is offline);
- every granted or claimed ticket has exactly one lease, its requester's, on a device of
  the class that is what it asked for; a ticket is granted once (one grant in the audit
  log, and its lease never changes once set), and a live lease made for a ticket belongs
  to a granted or claimed one;
- a cancelled ticket never gets a lease after its cancel (one granted before it ended then);
- each person's count of open tickets (``user_counts.open_tickets``) is their number of
  waiting tickets, their count of live leases their number of live leases;
- no lease comes from nowhere: each is one a reserve answered or a ticket's;
- none is lost: once the heartbeats and the reapers had their chance, no ticket waits
  while a device it would take is free; and at the end, once everything is released and
  the exporter reported it runs nothing, every ticket is claimed, expired or cancelled.

The same invariants hold through a storm of 40 tickets on the five devices; and the last
two tests hold the coordinator to two races these found: a release racing the heartbeat
that reports its lease's services up, and a reserve by name racing one by class (each once
deadlocked, or left a device in_use with no lease; every write that begins or ends a lease
now takes its host's lock first, as a heartbeat does).
"""
from __future__ import annotations

import functools
import itertools
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from conftest import WAIT_S, wait_for
from device_loop.coordinator.lifecycle import Settings
from lab_in_process import device
from live_lab import LIVE, LabDatabase, LiveExporter, Spread, service

DEVICES = 5
VIA = st.integers(0, 1)                 # the coordinator process a request goes through
CLAIM_WINDOW_S = 120.0                  # the coordinators' defaults: a grant not claimed within this expires,
ALLOCATING_TIMEOUT_S = 30.0             # and a lease pending longer than this fails
REAPED_WITHIN_S = 5 * Settings.reaper_interval_s  # five passes of each reaper: what they must have granted by then
EXAMPLES = itertools.count()            # each example has devices, a class, a host and users of its own
MCP_ACCEPT = {"Accept": "application/json, text/event-stream"}


class ClassExporter(LiveExporter):
    """A host whose devices are of one class, each with its own tags."""

    def __init__(self, spread: Spread, name: str, device_class: str, tags: dict[str, list[str]]):
        super().__init__(spread, name)
        self.device_class, self.tags = device_class, tags

    def body(self, devices: list[str], services=(), stopping: bool = False) -> dict:
        applied = sorted({s["lease"] for s in services})
        reports = [{**device(d), "class": self.device_class, "tags": self.tags[d]} for d in devices]
        body = self.report(reports, list(services), applied, heartbeat_s=self.HEARTBEAT_S, stopping=stopping)
        self.sent.append(body)
        return body


@dataclass
class KnownTicket:
    id: str
    user: str
    kind: str                       # "interactive" (REST) or "batch" (MCP)
    want: dict                      # {"device": ...} or {"class": ..., "tags": [...]}
    lease: str | None = None        # its lease, once the database showed one
    cancelled: bool = False         # its cancel was answered 200...
    lease_at_cancel: str | None = None  # ... when it had this lease (None: none, it never gets one)


@dataclass
class KnownLease:
    id: str
    user: str
    ticket: str | None = None       # the ticket it was granted to (None: a reserve answered it)
    released: bool = False          # its holder asked for its release


@dataclass
class Known:
    """What a test knows of the lab it drives: its tickets and leases."""
    tickets: dict[str, KnownTicket] = field(default_factory=dict)
    leases: dict[str, KnownLease] = field(default_factory=dict)


class QueueLab:
    """A class of ``DEVICES`` devices on one host of a lab of two coordinator processes,
    with users of its own: requests to it, and its invariants, read from the database."""

    def __init__(self, spread: Spread, urls: list[str], db: LabDatabase, tag: str, users: list[str]):
        self.spread, self.urls, self.db = spread, urls, db
        self.device_class, self.big = f"{tag}-class", f"{tag}-big"
        self.devices = [f"{tag}-d{i}" for i in range(DEVICES)]
        self.tags = {d: ["sim", self.big] if i < 3 else ["sim"] for i, d in enumerate(self.devices)}
        self.users = users
        self.exporter = ClassExporter(spread, f"{tag}-host", self.device_class, self.tags)
        self.ports = itertools.count(21000)
        self.known = Known()
        self.lock = threading.Lock()  # the known tickets and leases, for tests that use threads
        self.beat_lock = threading.Lock()

    # ---- requests ---------------------------------------------------------------------------

    def want(self, index: int) -> dict:
        """What a ticket asks for: the class, the class with a tag three of its devices have,
        the tag alone, or one device by name."""
        wants = [{"class": self.device_class}, {"class": self.device_class, "tags": [self.big]},
                 {"tags": [self.big]}] + [{"device": d} for d in self.devices]
        return wants[index % len(wants)]

    def reserve(self, via: int, user: str, want: dict, agent: bool = False) -> tuple[int, dict]:
        """A reserve with queue: true, by REST (a person: interactive) or MCP (an agent: batch):
        (status, answer or refusal as REST gives them)."""
        body = {**want, "queue": True, "ttl_s": 600}
        if not agent:
            response = self.spread.request(via, "POST", "/leases", user=user, json=body)
            return response.status_code, response.json()
        arguments = {("device_class" if k == "class" else k): v for k, v in body.items()}
        message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "reserve", "arguments": arguments}}
        response = self.spread.clients[via % 2].post(f"{self.urls[via % 2]}/mcp", json=message,
                                                     headers={"X-Device-Loop-User": user, **MCP_ACCEPT})
        assert response.status_code == 200, response.text
        result = response.json()["result"]
        if not result.get("isError"):
            return 201, result["structuredContent"]
        text = result["content"][0]["text"]
        code = re.search(r"\[(\w+)\]$", text)  # a refusal's code, as REST answers it, ends its message
        return 409, {"error": code[1] if code else text, "message": text}

    def record(self, user: str, want: dict, agent: bool, status: int, answer: dict) -> None:
        """What a reserve with queue: true answered: a lease, a ticket, or a refusal no wait cures."""
        with self.lock:
            if status == 201 and "ticket" in answer:
                assert (answer["state"], answer["requester"], answer["lease"]) == ("waiting", user, None), answer
                assert answer["kind"] == ("batch" if agent else "interactive"), answer
                self.known.tickets[answer["ticket"]] = KnownTicket(answer["ticket"], user, answer["kind"], want)
            elif status == 201:
                assert answer["holder"] == user and answer["device"] in self.devices, answer
                self.known.leases[answer["id"]] = KnownLease(answer["id"], user)
            else:
                assert status == 409 and answer["error"] in ("too_many_tickets", "already_yours"), answer
                if answer["error"] == "too_many_tickets":
                    waiting = sum(1 for r in self.ticket_rows() if r["requester"] == user and r["state"] == "waiting")
                    assert waiting >= 20, f"{user} refused a ticket with {waiting} open: {answer}"
                else:
                    assert "device" in want and self.live_holder(want["device"]) == user, answer

    def queue(self, via: int, user: str, want: dict, agent: bool = False) -> tuple[int, dict]:
        status, answer = self.reserve(via, user, want, agent)
        self.record(user, want, agent, status, answer)
        return status, answer

    def claim(self, via: int, ticket: KnownTicket, wait_s: float = 0) -> dict:
        """Its requester claims the ticket (a granted one is claimed by that; reading it claims nothing)."""
        response = self.spread.request(via, "POST", f"/tickets/{ticket.id}/claim", user=ticket.user,
                                       json={"wait_s": wait_s} if wait_s else {}, timeout=wait_s + 30)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["ticket"] == ticket.id and answer["requester"] == ticket.user, answer
        assert answer["state"] != "granted", f"its requester claimed it, yet it is not claimed: {answer}"
        if answer["state"] == "claimed":
            lease = answer["lease"]
            assert lease is not None and lease["holder"] == ticket.user and lease["device"] in self.devices, answer
            with self.lock:
                assert ticket.lease in (None, lease["id"]), f"{ticket.id} had {ticket.lease}, now shows {lease['id']}"
                ticket.lease = lease["id"]
                self.known.leases.setdefault(lease["id"], KnownLease(lease["id"], ticket.user, ticket.id))
        elif answer["state"] == "waiting":
            assert answer["lease"] is None and answer["position"] >= 1, answer
        return answer

    def cancel(self, via: int, ticket: KnownTicket) -> dict:
        response = self.spread.request(via, "POST", f"/tickets/{ticket.id}/cancel", user=ticket.user)
        answer = response.json()
        if response.status_code == 409:
            assert answer["error"] in ("ticket_ended", "ticket_changed"), answer
            return answer
        assert response.status_code == 200 and answer["state"] == "cancelled", response.text
        lease = answer["lease"]
        assert lease is None or lease["state"] not in LIVE, f"cancelled, yet its lease lives: {answer}"
        with self.lock:
            assert not ticket.cancelled, f"{ticket.id} cancelled twice: {answer}"
            ticket.cancelled, ticket.lease_at_cancel = True, lease["id"] if lease else None
            if lease is not None:
                assert ticket.lease in (None, lease["id"]), answer
                ticket.lease = lease["id"]
                self.known.leases.setdefault(lease["id"], KnownLease(lease["id"], ticket.user, ticket.id))
        return answer

    def release(self, via: int, lease: KnownLease) -> dict:
        response = self.spread.request(via, "POST", f"/leases/{lease.id}/release", user=lease.user)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["state"] not in LIVE, answer
        with self.lock:
            lease.released = True
        return answer

    def beat(self, via: int, serve: bool = True) -> None:
        """A heartbeat of all the devices, running the services the desired state asks for
        (``serve``) or none: either way what ended leases ran is gone, their reclaim completes."""
        with self.beat_lock:
            services = [service(s["lease"], s["device"], s["identifier"], next(self.ports))
                        for s in self.exporter.desired(via)["services"]] if serve else []
            self.exporter.beat(via, self.devices, services)

    # ---- the database -------------------------------------------------------------------------

    def ticket_rows(self) -> list[dict]:
        return self.db.rows("SELECT * FROM tickets WHERE requester = ANY($1::text[])", self.users)

    def live_holder(self, name: str) -> str | None:
        rows = self.db.rows("SELECT holder FROM leases WHERE device = $1 AND state = ANY($2::text[])", name, list(LIVE))
        return rows[0]["holder"] if rows else None

    def snapshot(self) -> dict:
        """The tickets, leases, grants, counts and devices of this lab, in one consistent read."""
        connection = self.db.connection

        async def read() -> dict:
            async with connection.transaction(isolation="repeatable_read", readonly=True):
                return {key: [dict(r) for r in await connection.fetch(sql, names)] for key, sql, names in (
                    ("tickets", "SELECT * FROM tickets WHERE requester = ANY($1::text[])", self.users),
                    ("leases", "SELECT * FROM leases WHERE device = ANY($1::text[]) ORDER BY created_at, id",
                     self.devices),
                    ("grants", "SELECT id, lease_id, device, detail FROM audit WHERE action = 'reserve' AND "
                               "device = ANY($1::text[])", self.devices),
                    ("counts", "SELECT * FROM user_counts WHERE name = ANY($1::text[])", self.users),
                    ("devices", "SELECT name, state, needs_recovery, fault FROM devices WHERE name = ANY($1::text[])",
                     self.devices))}
        return self.db.loop.run_until_complete(read())

    def matches(self, ticket: dict, name: str) -> bool:
        """Whether waiting ``ticket`` (a row) would take device ``name``."""
        return ((ticket["device"] is None or ticket["device"] == name)
                and (ticket["device_class"] is None or ticket["device_class"] == self.device_class)
                and set(json.loads(ticket["tags"])) <= set(self.tags[name]))

    def missed(self, snap: dict | None = None) -> list[str]:
        """Waiting tickets that a free device would take (``snap``: now)."""
        snap = snap or self.snapshot()
        free = [d["name"] for d in snap["devices"] if d["state"] == "idle" and not d["needs_recovery"]
                and not d["fault"]]
        return [f"{t['id']} ({t['device'] or t['device_class'] or ''} {t['tags']}) waits while {name} is free"
                for t in snap["tickets"] if t["state"] == "waiting" for name in free if self.matches(t, name)]

    def wait_until_granted(self, what: str) -> None:
        """Until no ticket waits while a device it would take is free (the reapers' work)."""
        found: list[str] = []

        def none_missed() -> bool:
            found[:] = self.missed()
            return not found
        try:
            wait_for(none_missed, REAPED_WITHIN_S, interval=0.05, what=what)
        except AssertionError:
            raise AssertionError(f"a ticket was lost {what}: " + "; ".join(found)) from None

    def check(self) -> dict:
        """Every invariant of the module's docstring, on one snapshot; the snapshot. (Read
        while no answer is being recorded: what the test knows is never newer than it.)"""
        with self.lock:
            snap = self.snapshot()
            self._check(snap)
        return snap

    def _check(self, snap: dict) -> None:
        known = self.known
        tickets = {t["id"]: t for t in snap["tickets"]}
        leases = {lease["id"]: lease for lease in snap["leases"]}
        assert tickets.keys() == known.tickets.keys(), f"tickets lost {known.tickets.keys() - tickets.keys()} " \
                                                       f"or from nowhere {tickets.keys() - known.tickets.keys()}"

        # one live lease a device, its leases one after the other
        by_device: dict[str, list[dict]] = {}
        for lease in snap["leases"]:
            by_device.setdefault(lease["device"], []).append(lease)
        states = {d["name"]: d["state"] for d in snap["devices"]}
        for name in self.devices:
            held = by_device.get(name, [])
            live = [lease["id"] for lease in held if lease["state"] in LIVE]
            assert len(live) <= 1, f"{name} has {len(live)} live leases: {live}"
            assert bool(live) == (states[name] in ("allocating", "in_use")) or states[name] == "offline", \
                f"{name} is {states[name]} with {'the live lease ' + live[0] if live else 'no live lease'}"
            for before, after in zip(held, held[1:]):
                assert before["ended_at"] is not None and before["ended_at"] <= after["created_at"], \
                    f"{name} was leased twice at once: {before} and {after}"

        # grants: once a ticket, as the audit log tells
        grants: dict[str, list[dict]] = {}
        for entry in snap["grants"]:
            ticket_id = json.loads(entry["detail"]).get("ticket")
            if ticket_id is not None:
                grants.setdefault(ticket_id, []).append(entry)
        assert grants.keys() <= tickets.keys(), f"grants to tickets nobody made: {grants.keys() - tickets.keys()}"
        of_ticket = {}
        for ticket_id, row in tickets.items():
            model = known.tickets[ticket_id]
            assert (row["requester"], row["kind"]) == (model.user, model.kind), row
            made = grants.get(ticket_id, [])
            assert len(made) <= 1, f"{ticket_id} was granted {len(made)} times: {made}"
            if row["lease_id"] is None:
                assert not made and row["granted_at"] is None and row["granted_device"] is None, row
                assert row["state"] in ("waiting", "cancelled"), f"{row['state']} without a lease: {row}"
                assert model.lease is None, f"{ticket_id} had lease {model.lease}, now none: {row}"
                continue
            assert [m["lease_id"] for m in made] == [row["lease_id"]], f"{ticket_id}: lease {row} but grants {made}"
            assert model.lease in (None, row["lease_id"]), \
                f"{ticket_id} granted again: its lease was {model.lease}, now {row['lease_id']}"
            model.lease = row["lease_id"]
            assert row["state"] != "waiting", f"a waiting ticket with a lease: {row}"
            lease = leases.get(row["lease_id"])
            assert lease is not None, f"{ticket_id}'s lease {row['lease_id']} is not on a device of its class"
            assert (lease["holder"], lease["device"]) == (row["requester"], row["granted_device"]), (row, lease)
            assert self.matches(row, lease["device"]), f"{ticket_id} wanted something else: {lease}"
            assert lease["created_at"] <= row["granted_at"], (row, lease)
            of_ticket[lease["id"]] = row
            if row["state"] == "granted":
                assert lease["state"] in LIVE or self._timed_out(lease), f"granted, its lease ended: {row} {lease}"
            elif row["state"] == "expired":
                assert row["ended_at"] - row["granted_at"] >= CLAIM_WINDOW_S, f"expired early: {row}"
        for ticket_id, model in known.tickets.items():
            if model.cancelled:
                row = tickets[ticket_id]
                assert row["state"] == "cancelled", f"{ticket_id} was cancelled, now {row['state']}"
                assert row["lease_id"] == model.lease_at_cancel, \
                    f"{ticket_id} got lease {row['lease_id']} after its cancel (it had {model.lease_at_cancel})"

        # every lease is one a reserve answered or a ticket's; a live one a live ticket's
        for lease_id, lease in leases.items():
            ticket = of_ticket.get(lease_id)
            if ticket is None:
                assert lease_id in known.leases and known.leases[lease_id].ticket is None, \
                    f"a lease from nowhere: {lease}"
            elif lease["state"] in LIVE:
                assert ticket["state"] in ("granted", "claimed"), f"a live lease of a {ticket['state']} ticket: {lease}"
            model = known.leases.get(lease_id)
            if model is not None:
                assert lease["holder"] == model.user, lease
                if model.released:
                    assert lease["state"] not in LIVE, f"released, yet live: {lease}"
            if lease["state"] == "failed":
                assert self._timed_out(lease), f"a lease failed before its services could time out: {lease}"
            elif lease["state"] == "expired":
                assert ticket is not None and ticket["state"] == "expired", f"expired by its ttl of 600 s? {lease}"

        # each person's counts are what they hold
        counts = {c["name"]: c for c in snap["counts"]}
        for user in self.users:
            waiting = sum(1 for t in tickets.values() if t["requester"] == user and t["state"] == "waiting")
            live = sum(1 for lease in leases.values() if lease["holder"] == user and lease["state"] in LIVE)
            row = counts.get(user, {"open_tickets": 0, "live_leases": 0})
            assert (row["open_tickets"], row["live_leases"]) == (waiting, live), \
                f"{user} is counted {row['open_tickets']} open tickets and {row['live_leases']} live leases, " \
                f"and has {waiting} waiting and {live} live"

    @staticmethod
    def _timed_out(lease: dict) -> bool:
        return lease["state"] == "failed" and lease["ended_at"] - lease["created_at"] >= ALLOCATING_TIMEOUT_S

    # ---- the end ------------------------------------------------------------------------------

    def settle(self, deadline_s: float = 20.0) -> None:
        """Release everything, claiming what is granted, until no ticket is open: each round
        the exporter reports (the reclaims complete, the devices go to the next tickets) and
        the reapers have their chance. Then every ticket is claimed, expired or cancelled, the
        lab idle and nobody counted anything."""
        deadline = time.monotonic() + deadline_s
        for n in itertools.count():
            with self.lock:
                tickets = list(self.known.tickets.values())
            states = {t["id"]: t["state"] for t in self.ticket_rows()}
            for ticket in tickets:
                if states[ticket.id] == "granted":
                    self.claim(n, ticket)
            with self.lock:
                leases = list(self.known.leases.values())
            for lease in leases:
                if not lease.released:
                    self.release(n + 1, lease)
            self.beat(n, serve=False)
            self.wait_until_granted("at the end, once the exporter reported")
            snap = self.check()
            if not any(t["state"] in ("waiting", "granted") for t in snap["tickets"]):
                break
            assert time.monotonic() < deadline, f"still open after {deadline_s} s: " \
                f"{[t for t in snap['tickets'] if t['state'] in ('waiting', 'granted')]}"
        assert {t["state"] for t in snap["tickets"]} <= {"claimed", "expired", "cancelled"}, snap["tickets"]
        self.beat(0, serve=False)
        snap = self.check()
        assert {d["name"]: d["state"] for d in snap["devices"]} == dict.fromkeys(self.devices, "idle"), snap["devices"]
        assert all(c["open_tickets"] == 0 and c["live_leases"] == 0 for c in snap["counts"]), snap["counts"]


# ---- the state machine ------------------------------------------------------------------------------

class TicketLab(RuleBasedStateMachine):
    """Three people, a class of five devices on one host, a lab of two coordinator processes."""

    spread: Spread      # set by the test
    urls: list[str]
    db: LabDatabase

    def __init__(self):
        super().__init__()
        n = next(EXAMPLES)
        self.users = [f"ann-{n}", f"ben-{n}", f"cat-{n}"]
        self.lab = QueueLab(self.spread, self.urls, self.db, f"q{n}", self.users)
        self.lab.beat(0)

    def _ticket(self, pick: int) -> KnownTicket | None:
        tickets = list(self.lab.known.tickets.values())
        return tickets[pick % len(tickets)] if tickets else None

    def _live_lease(self, pick: int) -> KnownLease | None:
        leases = [lease for lease in self.lab.known.leases.values() if not lease.released]
        return leases[pick % len(leases)] if leases else None

    # ---- people and agents ------------------------------------------------------------------

    @rule(user=st.integers(0, 2), want=st.integers(0, 7), via=VIA, agent=st.booleans())
    def queue(self, user, want, via, agent):
        """A reserve with queue: true, by class, tag or name, by a person or an agent."""
        self.lab.queue(via, self.users[user], self.lab.want(want), agent)

    @rule(wants=st.lists(st.integers(0, 7), min_size=2, max_size=6), agents=st.integers(0, 63))
    def queue_at_once(self, wants, agents):
        """Several reserves with queue: true at the same moment, through both processes, by
        class and tags or by name (test_a_reserve_by_name_and_one_by_class_at_once below: they
        once deadlocked)."""
        lab = self.lab
        calls = [(lab.reserve, k % 2, self.users[k % 3], lab.want(w), bool(agents >> k & 1))
                 for k, w in enumerate(wants)]
        answers = self.spread.at_once(*calls)
        for (_, _, user, want, agent), (status, answer) in zip(calls, answers):
            lab.record(user, want, agent, status, answer)

    @rule(pick=st.integers(0, 50), via=VIA, granted=st.booleans())
    def claim(self, pick, via, granted):
        """A ticket's requester reads it (one granted, if any is and ``granted``): claimed if it was granted."""
        ticket = self._ticket(pick)
        if granted:
            ids = sorted(r["id"] for r in self.lab.ticket_rows() if r["state"] == "granted")
            ticket = self.lab.known.tickets[ids[pick % len(ids)]] if ids else ticket
        if ticket is not None:
            self.lab.claim(via, ticket)

    @rule(pick=st.integers(0, 50), via=VIA)
    def someone_else_reads(self, pick, via):
        """Another name reads or claims a ticket (in the trust mode, too, a ticket is its
        requester's: docs/architecture.md, "Who may act on what"): it is told there is none, and
        a granted one is not claimed by that, only by its requester."""
        ticket = self._ticket(pick)
        if ticket is None:
            return
        other = self.users[(self.users.index(ticket.user) + 1) % 3]
        (before,) = self.db.rows("SELECT state FROM tickets WHERE id = $1", ticket.id)
        response = self.spread.request(via, "GET", f"/tickets/{ticket.id}", user=other)
        assert response.status_code == 404, response.text
        response = self.spread.request(via, "POST", f"/tickets/{ticket.id}/claim", user=other)
        assert response.status_code == 404, response.text
        (after,) = self.db.rows("SELECT state FROM tickets WHERE id = $1", ticket.id)
        if before["state"] == "granted":
            assert after["state"] != "claimed", f"claimed by {other}, who did not ask for it"

    @rule(pick=st.integers(0, 50), via=VIA)
    def cancel(self, pick, via):
        ticket = self._ticket(pick)
        if ticket is not None:
            self.lab.cancel(via, ticket)

    @rule(pick=st.integers(0, 50), via=VIA)
    def claim_and_cancel_at_once(self, pick, via):
        """A ticket's requester reads it through one process and cancels it through the other
        at the same moment: a granted one ends claimed or cancelled, never both."""
        ticket = self._ticket(pick)
        if ticket is None:
            return
        lab = self.lab
        read, cancelled = self.spread.at_once((lab.claim, via, ticket), (lab.cancel, 1 - via, ticket))
        assert not (read["state"] == "claimed" and cancelled.get("state") == "cancelled"), \
            f"claimed and cancelled both: {read}, {cancelled}"

    @rule(pick=st.integers(0, 50), via=VIA, then_beat=st.booleans())
    def release(self, pick, via, then_beat):
        """A lease's holder releases it; the exporter reports then, through the other process (``then_beat``)."""
        lease = self._live_lease(pick)
        if lease is None:
            return
        self.lab.release(via, lease)
        if then_beat:
            self.lab.beat(1 - via)
            self.lab.wait_until_granted("after a release and a heartbeat")

    # ---- the exporter, the reapers -----------------------------------------------------------

    @rule(via=VIA, serve=st.booleans())
    def heartbeat(self, via, serve):
        """The exporter reports: reclaims complete, the devices go to the tickets first in line."""
        self.lab.beat(via, serve)
        self.lab.wait_until_granted("after a heartbeat")

    @rule(via=VIA, user=st.integers(0, 2), want=st.integers(0, 7), agent=st.booleans())
    def queue_while_a_heartbeat_frees(self, via, user, want, agent):
        """A ticket queued through one process at the moment a heartbeat through the other
        frees devices: neither may see the other, and the reapers grant what both missed."""
        lab = self.lab
        (status, answer), _ = self.spread.at_once((lab.reserve, via, self.users[user], lab.want(want), agent),
                                                  (lab.beat, 1 - via))
        lab.record(self.users[user], lab.want(want), agent, status, answer)
        lab.wait_until_granted("by the reapers, after a ticket raced a heartbeat")

    # ---- after every step ---------------------------------------------------------------------

    @invariant()
    def lab_is_consistent(self):
        self.lab.check()

    def teardown(self):
        self.lab.settle()


# No shrinking: each replay of a live lab runs for real, so a failure is reported as it was
# found. (No preconditions either: which rules may run must not depend on timing; a rule
# with nothing to do returns.)
SETTINGS = settings(max_examples=6, stateful_step_count=25, deadline=None, derandomize=bool(os.environ.get("CI")),
                    phases=[Phase.explicit, Phase.reuse, Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.timeout(150)
def test_tickets_are_granted_once_and_never_lost_on_the_live_api(two_coordinators, postgres_database):
    spread, db = Spread(two_coordinators), LabDatabase(postgres_database)
    TicketLab.spread, TicketLab.urls, TicketLab.db = spread, [c.url for c in two_coordinators], db
    try:
        run_state_machine_as_test(TicketLab, settings=SETTINGS)
    finally:
        spread.close()
        db.close()


# ---- the storm ----------------------------------------------------------------------------------------

STORM_TICKETS = 40


@pytest.mark.timeout(120)
def test_a_storm_of_40_tickets_on_5_devices_through_two_processes(two_coordinators, postgres_database):
    """40 tickets queued at once through both processes (people's and agents', by class, tag
    and name) for 5 devices someone holds; then the devices are released, and each ticket's
    requester long-polls it, and releases the lease it is granted at once, while the exporter
    reports as fast as it is answered: the devices go round until all 40 were served. The
    invariants hold throughout (checked between heartbeats) and at the end every ticket was
    granted exactly once, the people's before the agents', and no device was leased twice at once."""
    spread, db = Spread(two_coordinators, timeout=60), LabDatabase(postgres_database)
    users = [f"storm-{n}" for n in range(4)]
    lab = QueueLab(spread, [c.url for c in two_coordinators], db, "storm", [*users, "holder"])
    try:
        lab.beat(0)
        for n, name in enumerate(lab.devices):
            status, answer = lab.queue(n, "holder", {"device": name})
            assert status == 201 and "id" in answer, answer
        held = list(lab.known.leases.values())

        wants = [lab.want(k if k % 4 else 0) for k in range(STORM_TICKETS)]  # a quarter by class alone
        calls = [(lab.reserve, k, users[k % 4], wants[k], k % 5 == 4) for k in range(STORM_TICKETS)]
        answers = spread.at_once(*calls)
        assert all(status == 201 and answer.get("state") == "waiting" for status, answer in answers), answers
        for (_, _, user, want, agent), (status, answer) in zip(calls, answers):
            lab.record(user, want, agent, status, answer)
        assert len(lab.known.tickets) == STORM_TICKETS
        lab.check()

        served: dict[str, list[str]] = {}  # ticket -> the leases its requester saw it claim
        failures: list[BaseException] = []
        stop = threading.Event()

        def requester(k: int, ticket: KnownTicket) -> None:
            try:
                while not stop.is_set():
                    answer = lab.claim(k, ticket, wait_s=5)
                    if answer["state"] == "claimed":
                        served.setdefault(ticket.id, []).append(answer["lease"]["id"])
                        lab.release(k + 1, lab.known.leases[answer["lease"]["id"]])
                        return
                    assert answer["state"] == "waiting", answer
            except BaseException as exc:  # reported by the main thread
                failures.append(exc)

        threads = [threading.Thread(target=requester, args=(k, t), daemon=True)
                   for k, t in enumerate(list(lab.known.tickets.values()))]
        for thread in threads:
            thread.start()
        try:
            for n, lease in enumerate(held):
                lab.release(n, lease)
            deadline = time.monotonic() + WAIT_S
            for n in itertools.count():
                lab.beat(n, serve=n % 2 == 0)  # serving the leases' services, and not (a release races both)
                snap = lab.check()
                if failures or not any(t.is_alive() for t in threads):
                    break
                assert time.monotonic() < deadline, (
                    f"served {len(served)} of {STORM_TICKETS} in {WAIT_S:g} s; open: "
                    f"{[t for t in snap['tickets'] if t['state'] in ('waiting', 'granted')]}; devices: "
                    f"{snap['devices']}; live leases: {[x for x in snap['leases'] if x['state'] in LIVE]}")
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        if failures:
            raise failures[0]
        assert len(served) == STORM_TICKETS and all(len(v) == 1 for v in served.values()), served

        lab.settle()
        snap = lab.check()
        rows = {t["id"]: t for t in snap["tickets"]}
        assert all(t["state"] == "claimed" for t in rows.values()), rows
        assert {rows[t]["lease_id"] for t in served} == {v[0] for v in served.values()}
        assert len(snap["leases"]) == STORM_TICKETS + len(held), "a lease besides the holder's and the tickets'"
        # who went first, where the order is the lab's to choose: of the tickets that wanted
        # the class alone, people's before agents', first come first served within each
        alone = sorted((t for t in rows.values() if t["device_class"] and t["tags"] == "[]"),
                       key=lambda t: t["granted_at"])
        order = [(t["kind"] == "batch", t["created_at"]) for t in alone]
        assert order == sorted(order), [(t["kind"], t["created_at"], t["granted_at"]) for t in alone]
    finally:
        spread.close()
        db.close()


@pytest.mark.timeout(90)
def test_releases_racing_the_heartbeat_that_reports_their_services_up(two_coordinators, postgres_database):
    """Why the storm above has the exporter run nothing: a lease released through one process
    while a heartbeat through the other reports its services up (a requester who lets go of a
    ticket's lease at once, say) must be answered, and once the exporter runs nothing the
    device is idle. A release locks the lease, then the device; the heartbeat writes the
    devices it read, then activates the leases: the two deadlock, or the heartbeat, waiting
    for the device's row, writes the state it computed before the release over it."""
    spread, db = Spread(two_coordinators), LabDatabase(postgres_database)
    lab = QueueLab(spread, [c.url for c in two_coordinators], db, "race", ["racer"])
    try:
        lab.beat(0, serve=False)
        for round_ in range(30):
            leases = [spread.request(0, "POST", "/leases", user="racer", json={"device": d}).json()
                      for d in lab.devices]
            assert all("id" in lease for lease in leases), leases
            up = [service(lease["id"], lease["device"], f"sim:{lease['device']}", next(lab.ports)) for lease in leases]
            answers = spread.at_once((lab.exporter.post, 1, lab.exporter.body(lab.devices, up)),
                                     *((spread.request, 0, "POST", f"/leases/{lease['id']}/release", "racer")
                                       for lease in leases))
            failed = [(a.request.url.path, a.status_code, a.text) for a in answers if a.status_code >= 500]
            assert not failed, f"round {round_}: {failed}"
            lab.beat(0, serve=False)  # the exporter runs nothing: every reclaim completes
            snap = lab.snapshot()
            stuck = {d["name"]: d["state"] for d in snap["devices"] if d["state"] != "idle"}
            assert not stuck, f"round {round_}: no lease lives, the exporter runs nothing, yet {stuck}"
    finally:
        spread.close()
        db.close()


@pytest.mark.timeout(90)
def test_a_reserve_by_name_and_one_by_class_at_once(two_coordinators, postgres_database):
    """One person reserves a device by name through one process while reserving one of its
    class through the other, all of the class free: both are answered (two leases, or one and
    a refusal), never a 500."""
    spread, db = Spread(two_coordinators), LabDatabase(postgres_database)
    lab = QueueLab(spread, [c.url for c in two_coordinators], db, "pick", ["picker"])
    try:
        lab.beat(0, serve=False)
        for round_ in range(40):
            answers = spread.at_once(
                (functools.partial(spread.request, 0, "POST", "/leases", user="picker",
                                   json={"device": lab.devices[round_ % DEVICES]}),),
                (functools.partial(spread.request, 1, "POST", "/leases", user="picker",
                                   json={"class": lab.device_class}),))
            failed = [(a.status_code, a.text) for a in answers if a.status_code >= 500]
            assert not failed, f"round {round_}: {failed}"
            for answer in answers:
                if answer.status_code == 201:
                    lab.release(0, KnownLease(answer.json()["id"], "picker"))
            lab.beat(1, serve=False)
    finally:
        spread.close()
        db.close()
