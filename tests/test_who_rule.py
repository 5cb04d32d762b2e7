"""One rule for who may act on what (docs/architecture.md, "Who may act on what"): every call
of the calls table that reads or acts on a thing someone owns (a lease, a queue ticket, a job,
an image) is made by the owner, another person, an agent, the trust mode's caller under
another name, and an admin, and answers exactly those the rule lets through."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conftest import SQLITE_ONLY
from device_loop.coordinator.calls import CALLS, Call, Ctx
from device_loop.coordinator.errors import APIError
from device_loop.coordinator.identity import USER
from device_loop.coordinator.who import CallerKind, Who
from device_loop.core.ab.jobs import JobSpec
from device_loop.core.vocabulary import TicketKind
from lab_in_process import FakeExporter, device, in_process_lab
from test_images import upload

# the rules here run the same SQL on either database, which the store's own tests, the
# statement counts and the OpenAPI run check on PostgreSQL: SQLite only (docs/architecture.md, "Testing")
DATABASES = SQLITE_ONLY

OWNER = "alice"
SPEC = JobSpec.model_validate({"target": {"class": "sim-board"}, "run": ["true"]})

# The rule, written out (not asked of Who): True lets the caller through.
CALLERS: list[tuple[str, Who, bool]] = [
    ("another person", Who("bob"), False),
    ("an agent", Who("agent-7", CallerKind.AGENT), False),
    ("the trust mode's caller under another name", Who("carol", CallerKind.TRUSTED_LOCAL), False),
    ("an exporter", Who("exporter:host-a", CallerKind.EXPORTER, host="host-a"), False),
    ("the owner", Who(OWNER), True),
    ("the owner's agent token", Who(OWNER, CallerKind.AGENT), True),
    ("the owner in the trust mode", Who(OWNER, CallerKind.TRUSTED_LOCAL), True),
    ("an admin", Who("root", admin=True), True),
]

# What each call names (the thing it acts on) and what else it takes.
OWNED: dict[str, tuple[str, dict[str, Any]]] = {
    "lease_status": ("lease", {}),
    "lease_cdi": ("lease", {}),
    "renew": ("lease", {"ttl_s": 60}),
    "release": ("lease", {}),
    "start_operation": ("lease", {"kind": "count", "args": {}}),
    "flash": ("lease", {"image": "jupiter-v1"}),
    "recover": ("lease", {}),
    "settle": ("lease", {}),
    "power": ("lease", {"action": "status"}),
    "camera_snapshot": ("lease", {}),
    "uart_exchange": ("lease", {"send": "", "wait_s": 0}),
    "exec": ("lease", {"command": "true", "timeout_s": 1}),
    "fingerprint": ("lease", {}),
    "ticket_status": ("ticket", {}),
    "claim_ticket": ("ticket", {}),
    "cancel_ticket": ("ticket", {}),
    "job_status": ("job", {}),
    "job_evidence": ("job", {}),
    "beat_job": ("job", {}),
    "reserve_for_job": ("job", {"cell": 0, "class": "no-such-class"}),
    "report_cell": ("job", {}),
    "report_run": ("job", {}),
    "finish_job": ("job", {"state": "done"}),
    "cancel_job": ("job", {}),
    "job_runs": ("job", {}),
    "delete_job": ("job", {}),
    "remove_image": ("image", {}),
}
ID_FIELD = {"lease": "lease_id", "ticket": "ticket_id", "job": "job_id", "image": "ref"}
REFUSED_AS_UNKNOWN = {"unknown_lease", "unknown_ticket", "unknown_job"}  # (an owned thing's id is private)


def test_every_call_on_an_owned_thing_is_held_to_the_rule():
    """A call of a person that names a lease, ticket or job (or removes an image) is walked
    below: a new one is added there."""
    named = {call.name for call in CALLS if call.access == USER and ({"lease_id", "ticket_id", "job_id"}
                                                                      & set(call.args.model_fields))}
    assert named | {"remove_image"} == set(OWNED)


def _refused(outcome: BaseException | None) -> bool:
    if not isinstance(outcome, APIError):
        return False  # through the rule (whatever came after it)
    code = getattr(outcome.code, "value", outcome.code)
    return outcome.status == 403 or (outcome.status == 404 and code in REFUSED_AS_UNKNOWN)


async def _outcome(call: Call, ctx: Ctx, args: Any) -> BaseException | None:
    try:
        await call.carry_out(ctx, args)
    except Exception as exc:  # noqa: BLE001 - anything but a refusal got past the rule
        return exc
    return None


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
@pytest.mark.parametrize("name", sorted(OWNED))
async def test_who_may_act_on_what(tmp_path, name):
    call = next(c for c in CALLS if c.name == name)
    what, extra = OWNED[name]
    async with in_process_lab(tmp_path) as (client, rules, clock):
        owner = client(OWNER)
        await FakeExporter(owner, "host-a").beat([device("b0"), device("b1")])
        image = (await upload(owner)).json()
        owned = {"image": image["name"]}
        owned["lease"] = (await rules.leases.reserve("b1", None, Who(OWNER)))["id"]
        await rules.leases.reserve("b0", None, Who("zed"))
        owned["ticket"] = (await rules.scheduler.reserve("b0", None, [], None, True, Who(OWNER),
                                                         TicketKind.INTERACTIVE))["ticket"]
        owned["job"] = (await rules.jobs.submit(SPEC, True, None, Who(OWNER), TicketKind.INTERACTIVE))["id"]
        args = call.args.model_validate({ID_FIELD[what]: owned[what], **extra})
        for label, who, allowed in CALLERS:  # (the refused first: they change nothing)
            assert who.may_act_on(OWNER) is allowed, f"Who.may_act_on answers {label} against the rule"
            ctx = Ctx(rules, who, asyncio.Event().wait, 0)
            outcome = await _outcome(call, ctx, args)
            assert _refused(outcome) is not allowed, f"{name} by {label}: {outcome!r}"


# Who sees all (the rule, written out): the board and the lists show them more.
SEERS: list[tuple[str, Who, bool]] = [
    ("another person", Who("bob"), False),
    ("an agent", Who("agent-7", CallerKind.AGENT), False),
    ("an exporter", Who("exporter:host-a", CallerKind.EXPORTER, host="host-a"), False),
    ("the trust mode's caller under another name", Who("carol", CallerKind.TRUSTED_LOCAL), True),
    ("an admin", Who("root", admin=True), True),
]
# What each call shows only to who sees all, as a question of its answer about alice's things.
SHOWN: dict[str, tuple[dict[str, Any], Any]] = {
    "device_info": ({"name": "b1"}, lambda answer, owned: answer.get("lease") == owned["lease"]),
    "queue_board": ({}, lambda answer, owned: [e["ticket"] for e in answer] == [owned["ticket"]]),
    "my_tickets": ({"all": True}, lambda answer, owned: owned["ticket"] in [t["ticket"] for t in answer]),
    "my_jobs": ({"all": True}, lambda answer, owned: owned["job"] in [j["id"] for j in answer]),
}


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_who_sees_all(tmp_path):
    """Lease ids on devices, ticket ids on the queue, everyone's tickets and jobs: admins and
    the trust mode's caller; not another person, an agent or an exporter."""
    async with in_process_lab(tmp_path) as (client, rules, clock):
        await FakeExporter(client(OWNER), "host-a").beat([device("b0"), device("b1")])
        owned = {"lease": (await rules.leases.reserve("b1", None, Who(OWNER)))["id"]}
        await rules.leases.reserve("b0", None, Who("zed"))
        owned["ticket"] = (await rules.scheduler.reserve("b0", None, [], None, True, Who(OWNER),
                                                         TicketKind.INTERACTIVE))["ticket"]
        owned["job"] = (await rules.jobs.submit(SPEC, False, None, Who(OWNER), TicketKind.INTERACTIVE))["id"]
        for name, (given, shows) in SHOWN.items():
            call = next(c for c in CALLS if c.name == name)
            for label, who, sees in SEERS:
                assert who.may_see_all is sees, f"Who.may_see_all answers {label} against the rule"
                answer = await call.carry_out(Ctx(rules, who, asyncio.Event().wait, 0), call.args.model_validate(given))
                assert shows(answer, owned) is sees, f"{name} for {label}: {answer}"
