"""One check of a scoped token, at the coordinator, from the calls table (docs/architecture.md,
"Shares of one lab"): every call of ``CALLS`` is made, through REST where it has a route and
through MCP where it is a tool, by a scoped token allowed no operation (a reading call passes,
an acting call is refused 403 ``out_of_scope`` naming its operation) and by one allowed just
that call's operation (it passes the check)."""
from __future__ import annotations

import re
from typing import Any

import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from device_loop.coordinator.calls import BY_NAME, CALLS, Call
from device_loop.coordinator.identity import issue_token
from device_loop.core.scopes import TokenScope
from device_loop.core.vocabulary import TokenKind
from lab_in_process import in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

L, J = "lease-nope", "job-nope"
SPEC = {"target": {"class": "sim-board"}, "run": ["true"]}
RUN = {"seq": 0, "arm": "A", "started_at": 1.0, "ended_at": 1.5, "status": 0}

# What each call is sent (as the wire names it: a path's names, a query's or body's fields),
# and the scope operation it needs, written out here (None: a reading call, or one no scoped
# token may make at all: an admin's, an exporter's). A call added to the table is added here.
WALK: dict[str, tuple[dict[str, Any], str | None]] = {
    "health": ({}, None), "list_devices": ({}, None), "device_info": ({"name": "b0"}, None),
    "device_log": ({"name": "b0"}, None), "device_operations": ({"name": "b0"}, None),
    "device_flashes": ({"name": "b0"}, None), "list_hosts": ({}, None),
    "heartbeat": ({"name": "host-a"}, None), "desired": ({"name": "host-a"}, None),
    "image_content": ({"name": "host-a", "sha256": "ab"}, None),
    "reserve": ({"device": "b0"}, None), "ticket_status": ({"ticket_id": "t-nope"}, None),
    "claim_ticket": ({"ticket_id": "t-nope"}, None), "cancel_ticket": ({"ticket_id": "t-nope"}, None), "my_tickets": ({}, None), "queue_board": ({}, None),
    "my_leases": ({}, None), "whoami": ({}, None), "lease_status": ({"lease_id": L}, None),
    "lease_cdi": ({"lease_id": L}, None),
    "renew": ({"lease_id": L, "ttl_s": 60}, None), "release": ({"lease_id": L}, None),
    "start_operation": ({"lease_id": L, "kind": "count", "args": {}}, "count"),
    "flash": ({"lease_id": L, "image": "rootfs-v2"}, "flash"), "recover": ({"lease_id": L}, "recover"),
    "operation_status": ({"op_id": "op-nope"}, None), "settle": ({"lease_id": L}, "settle"),
    "power": ({"lease_id": L, "action": "cycle"}, "power.cycle"),
    "camera_snapshot": ({"lease_id": L}, "camera"),
    "uart_exchange": ({"lease_id": L, "send": "\r", "wait_s": 0}, "uart"),
    "exec": ({"lease_id": L, "command": "true"}, "exec"), "fingerprint": ({"lease_id": L}, "fingerprint"),
    "submit_job": ({"spec": SPEC}, "job"), "my_jobs": ({}, None), "claim_job": ({}, "job"),
    "job_status": ({"job_id": J}, None), "job_evidence": ({"job_id": J}, None), "job_runs": ({"job_id": J}, None),
    "delete_job": ({"job_id": J}, None),
    "beat_job": ({"job_id": J}, "job"), "reserve_for_job": ({"job_id": J, "class": "sim-board"}, "job"),
    "report_cell": ({"job_id": J}, "job"), "report_run": ({"job_id": J}, "job"),
    "finish_job": ({"job_id": J, "state": "done"}, "job"), "cancel_job": ({"job_id": J}, None),
    "upload_image": ({"name": "rootfs-v2", "for": "b0"}, "image"), "list_images": ({}, None),
    "image_info": ({"ref": "rootfs-v2"}, None), "remove_image": ({"ref": "rootfs-v2"}, "image"),
    "create_token": ({"user": "zed"}, None), "list_tokens": ({}, None), "revoke_token": ({"token_id": "tok-x"}, None),
    "set_token": ({"token_id": "tok-x", "band": "urgent"}, None),
    "revoke_lease": ({"lease_id": L}, None), "retire_device": ({"device": "b0"}, None),
    "recover_unleased": ({"device": "b0"}, None), "power_unleased": ({"device": "b0", "action": "off"}, None),
    "clear_fault": ({"device": "b0"}, None), "kill_orphans": ({"device": "b0"}, None),
    "mark_faulty": ({"device": "b0", "reason": "smoke"}, None), "drain_host": ({"host": "host-a"}, None),
    "forget": ({"name": "b0", "kind": "device"}, None), "audit_log": ({}, None), "list_candidates": ({}, None),
    "adopt_candidate": ({"identifier": "net-1", "name": "n1"}, None),
    "mark_image_good": ({"ref": "rootfs-v2", "for": "b0"}, None), "collect_images": ({}, None),
}
BODIES = {"heartbeat": {}, "report_cell": {"cell": 0}, "report_run": RUN}  # a body that is a model of its own


def test_every_call_names_the_operation_it_needs():
    """The table's ``needs`` against the rule written out above: every call is here, and a
    power action or an operation's kind is what its arguments name (an invalid power action
    needs ``power``, which no scope lists: refused, never let through)."""
    assert set(WALK) == {call.name for call in CALLS}, "a call was added or removed: say what it needs, here"
    for name, (sent, needed) in WALK.items():
        call = BY_NAME[name]
        assert call.operation(call.args.model_validate(sent)) == needed, name
    start = BY_NAME["start_operation"]
    for given, needed in [({"kind": "power", "args": {"action": "off"}}, "power.off"),
                          ({"kind": "power", "args": {"action": "zap"}}, "power"),
                          ({"kind": "power", "args": {"action": 1}}, "power"),
                          ({"kind": "flash", "args": {"image": "x"}}, "flash")]:
        assert start.operation(start.args.model_validate({"lease_id": L, **given})) == needed
    assert "power" not in TokenScope(operations=("power.cycle",)).operations


def _rest(call: Call, sent: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """(method, path, request keywords) of ``call`` sent ``sent``."""
    rest = dict(sent)
    path = re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: str(rest.pop(m.group(1))), call.path or "")
    if call.name in BODIES:
        return call.method or "", path, {"json": BODIES[call.name]}
    if call.streamed:
        return call.method or "", path, {"params": rest, "content": b"image bytes"}
    if call.method == "GET":
        return "GET", path, {"params": rest}
    return call.method or "", path, {"json": rest}


def _agent(app, token: str) -> Client:
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), headers={"Authorization": f"Bearer {token}"},
                              timeout=30)
    return Client(streamable_http_client("http://127.0.0.1/mcp", http_client=http))


async def _outcomes(client, rules, operations: tuple[str, ...], names: list[str]) -> dict[str, tuple[str, str]]:
    """What each call of ``names`` answered a scoped agent allowed ``operations``: name ->
    (its error code, or "ok", and its message), by REST for a route, then by MCP for a tool."""
    scope = TokenScope(operations=operations)
    token = (await issue_token(rules.store, rules.clock, "agent-7", kind=TokenKind.AGENT, scope=scope))["token"]
    api, outcomes = client(token=token), {}
    for name in names:
        call, (sent, _) = BY_NAME[name], WALK[name]
        if call.path is not None:
            method, path, kwargs = _rest(call, sent)
            answer = await api.request(method, path, **kwargs)
            said = answer.json() if answer.headers.get("content-type", "").startswith("application/json") else {}
            error = said.get("error", "ok") if isinstance(said, dict) else "ok"
            outcomes[f"REST {name}"] = (error if answer.status_code >= 400 else "ok", str(said))
    async with _agent(client.app, token) as agent:
        for name in names:
            call, (sent, _) = BY_NAME[name], WALK[name]
            if call.tool:
                kwargs = call.args.model_validate(sent).model_dump(mode="json", exclude_unset=True)
                result = await agent.call_tool(name, kwargs)
                text = result.content[0].text if result.is_error and result.content else ""
                found = re.search(r"\[(\w+)\]$", text)
                outcomes[f"MCP {name}"] = (found.group(1) if found else "ok", text)
    return outcomes


async def test_a_scoped_token_is_checked_on_every_call(tmp_path):
    """Allowed nothing: every reading call passes the check, every acting call is refused
    403 out_of_scope naming its operation, by REST and by MCP. Allowed one operation: each
    acting call that needs it passes (whatever its own rules then say of a lease that is not)."""
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        outcomes = await _outcomes(client, rules, (), list(WALK))
        assert len(outcomes) == sum((c.path is not None) + c.tool for c in CALLS)
        for key, (error, said) in outcomes.items():
            needed = WALK[key.split()[1]][1]
            if needed is None:
                assert error != "out_of_scope", f"{key} is a reading call: {said}"
            else:
                assert error == "out_of_scope", f"{key}: {error} {said}"
                assert "scope: this token may run no operation" in said and f"not {needed}" in said, said
        for needed in sorted({n for _, n in WALK.values() if n is not None}):
            names = [name for name, (_, n) in WALK.items() if n == needed]
            for key, (error, said) in (await _outcomes(client, rules, (needed,), names)).items():
                assert error != "out_of_scope", f"{key} allowed {needed}: {said}"


async def test_a_scoped_call_costs_no_statement_more_and_a_refused_one_only_its_token_s(tmp_path):
    """The scope is read with the token's row, which every call reads anyway, and parsed once
    per distinct scope (docs/architecture.md, "Shares of one lab"): a scoped token's call runs
    as many statements as an unscoped one's, and a call refused by its scope only that lookup."""
    from lab_in_process import FakeExporter, device

    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        exporter = client(token=(await issue_token(rules.store, rules.clock, host="host-a"))["token"])
        await FakeExporter(exporter, "host-a").beat([device("b0"), device("b1")])
        agents = {}
        for name, device_name, scope in (("plain", "b0", None), ("scoped", "b1", TokenScope(operations=("settle",)))):
            token = (await issue_token(rules.store, rules.clock, name, kind=TokenKind.AGENT, scope=scope))["token"]
            api = client(token=token)
            agents[name] = (api, (await api.post("/leases", json={"device": device_name})).json()["id"])

        async def cost(name: str, method: str, path: str) -> tuple[int, int]:
            api, lease = agents[name]
            before = rules.store.statements
            answer = await api.request(method, path.format(lease=lease))
            return answer.status_code, rules.store.statements - before

        for method, path in (("GET", "/leases/{lease}"), ("POST", "/leases/{lease}/settle")):
            plain, scoped = await cost("plain", method, path), await cost("scoped", method, path)
            assert plain == scoped and plain[0] < 300, (path, plain, scoped)
        assert await cost("scoped", "POST", "/leases/{lease}/recover") == (403, 1)
