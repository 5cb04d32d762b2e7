"""Scoped tokens as an admin makes and changes them (docs/architecture.md, "Shares of one lab"):
what only the lab can judge is refused at creation with the field named (a class no device
has, an operation nothing runs, a lease longer than the lab's, a scope on an admin's token),
hostile scopes never reach the table, and a scope or band changed in place holds the token's
next call without a new token. The command line's words for them (``--scope``, ``--budget``)."""
from __future__ import annotations

import asyncio

import httpx2
import pytest
from click.testing import CliRunner
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from device_loop.client.http import CoordinatorError
from device_loop.client.lab_trouble import wrong_request
from device_loop.coordinator.identity import issue_token
from device_loop.core.errors import ErrorCode
from device_loop.core.protocol import OperationKindReport
from device_loop.core.scopes import describe_budget, describe_scope, parse_budget, parse_scope, TokenScope
from lab_in_process import FakeExporter, device, in_process_lab

DAY = 86400


def counting_board(name: str) -> dict:
    """A board whose console resource runs a plugin's kind of operation, ``count``."""
    report = device(name)
    report["resources"][0]["operations"] = [OperationKindReport(kind="count").model_dump()]
    return report


async def _lab_with_root(client, rules):
    root = client(token=(await issue_token(rules.store, rules.clock, "root", admin=True))["token"])
    exporter = client(token=(await issue_token(rules.store, rules.clock, host="host-a"))["token"])
    assert (await FakeExporter(exporter, "host-a").beat([counting_board("b0")])).status_code == 200
    return root


HOSTILE: list[tuple[str, dict, str]] = [
    ("a class no device has", {"scope": {"classes": ["sim-board", "nope"]}}, "scope.classes: no device has class 'nope'"),
    ("a negative budget", {"scope": {"budget_s": -60}}, "scope.budget_s"),
    ("a ten-year lease", {"scope": {"max_lease_s": 10 * 365 * DAY}}, "scope.max_lease_s"),
    ("a lease longer than the lab's", {"scope": {"max_lease_s": 2 * DAY}}, "longer than this lab's longest lease, 1d"),
    ("10,000 classes", {"scope": {"classes": [f"c{i}" for i in range(10_000)]}}, "scope.classes"),
    ("an operation nothing runs", {"scope": {"operations": ["exec", "teleport"]}},
     "scope.operations: nothing here runs 'teleport'"),
    ("power alone", {"scope": {"operations": ["power"]}}, "scope.operations: nothing here runs 'power'"),
    ("garbage for an operation", {"scope": {"operations": ["rm -rf /"]}}, "scope.operations.0"),
    ("a name too long", {"scope": {"tags": ["t" * 65]}}, "scope.tags.0"),
    ("no such field", {"scope": {"superuser": True}}, "scope.superuser"),
    ("budget as text", {"scope": {"budget_s": "lots"}}, "scope.budget_s"),
    ("a band of its own", {"band": "superuser"}, "band"),
    ("a scope on an admin's token", {"admin": True, "scope": {"operations": ["exec"]}},
     "scope: an admin token is unscoped"),
]


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_hostile_scopes_are_refused_at_creation_with_the_field_named(tmp_path):
    async with in_process_lab(tmp_path, single_user=False, max_ttl_s=DAY) as (client, rules, clock):
        root = await _lab_with_root(client, rules)
        for label, given, says in HOSTILE:
            answer = await root.post("/admin/tokens", json={"user": "agent-1", "kind": "agent", **given})
            assert 400 <= answer.status_code < 500 and says in answer.json()["message"], (label, answer.text[:300])
        on_exporter = await root.post("/admin/tokens", json={"exporter_host": "host-b", "band": "urgent"})
        assert on_exporter.status_code == 422 and "band: an exporter's token" in on_exporter.json()["message"]
        assert [t["user"] for t in (await root.get("/admin/tokens")).json()] == ["root", "exporter:host-a"]

        made = await root.post("/admin/tokens", json={
            "user": "agent-1", "kind": "agent", "band": "background",
            "scope": {"classes": ["sim-board"], "operations": ["exec", "power.cycle", "count"], "max_leases": 2,
                      "max_lease_s": 7200, "budget_s": 7200, "budget_period": "day"}})
        assert made.status_code == 201, made.text
        assert made.json()["band"] == "background" and made.json()["scope"]["operations"] == ["exec", "power.cycle",
                                                                                             "count"]


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_a_scope_changed_in_place_holds_the_token_s_next_call(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        root = await _lab_with_root(client, rules)
        made = (await root.post("/admin/tokens", json={"user": "agent-1", "kind": "agent", "scope": {
            "classes": ["sim-board"], "operations": ["exec"], "budget_s": 3600}})).json()
        agent = client(token=made["token"])
        lease = (await agent.post("/leases", json={"device": "b0"})).json()
        power = await agent.post(f"/leases/{lease['id']}/power", json={"action": "status"})
        assert power.status_code == 403 and power.json()["message"] == ("scope: this token may run exec; not "
                                                                         "power.status")

        widened = await root.post(f"/admin/tokens/{made['id']}", json={"scope": {"operations": ["exec", "power.status"]},
                                                                      "band": "urgent"})
        assert widened.status_code == 200, widened.text
        scope = widened.json()["scope"]
        assert (scope["operations"], scope["classes"], scope["budget_s"], widened.json()["band"]) == (
            ["exec", "power.status"], ["sim-board"], 3600, "urgent")  # what was not named stays
        again = await agent.post(f"/leases/{lease['id']}/power", json={"action": "status"})
        assert again.json()["error"] == "no_such_operation", again.text  # past its scope: b0 has no switch

        lifted = (await root.post(f"/admin/tokens/{made['id']}", json={"scope": {"budget_s": None}})).json()
        assert lifted["scope"]["budget_s"] is None and lifted["scope"]["classes"] == ["sim-board"]
        narrowed = await root.post(f"/admin/tokens/{made['id']}", json={"scope": {"operations": []}})
        assert narrowed.status_code == 200
        assert (await agent.post(f"/leases/{lease['id']}/settle")).json()["error"] == "out_of_scope"
        freed = (await root.post(f"/admin/tokens/{made['id']}", json={"unscoped": True})).json()
        assert freed["scope"] is None and freed["band"] == "urgent"
        assert (await agent.post(f"/leases/{lease['id']}/settle")).status_code == 201

        for given, status, says in [({"scope": {"operations": ["teleport"]}}, 422, "scope.operations"),
                                    ({"scope": {"max_lease_s": 30}}, 422, "scope.max_lease_s"),
                                    ({"unscoped": True, "scope": {}}, 422, "unscoped"),
                                    ({"band": "superuser"}, 422, "band")]:
            answer = await root.post(f"/admin/tokens/{made['id']}", json=given)
            assert answer.status_code == status and says in answer.json()["message"], answer.text
        root_id = next(t["id"] for t in (await root.get("/admin/tokens")).json() if t["user"] == "root")
        on_admin = await root.post(f"/admin/tokens/{root_id}", json={"scope": {"operations": ["exec"]}})
        assert on_admin.status_code == 422 and "an admin token is unscoped" in on_admin.json()["message"]
        assert (await root.post("/admin/tokens/tok-nope", json={"band": "urgent"})).status_code == 404
        await root.post(f"/admin/tokens/{made['id']}/revoke")
        assert (await root.post(f"/admin/tokens/{made['id']}", json={"band": "normal"})).status_code == 409
        assert ("root", "token_set") in [(a["actor"], a["action"]) for a in (await root.get("/admin/audit")).json()]


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_two_admins_setting_one_token_at_once_both_hold_and_a_stale_scope_is_refused_not_a_500(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        root = await _lab_with_root(client, rules)
        made = (await root.post("/admin/tokens", json={"user": "agent-1", "kind": "agent",
                                                       "scope": {"classes": ["sim-board"]}})).json()
        for n in range(3):  # (each change read, merged and written under the token's row lock)
            first, second = await asyncio.gather(
                root.post(f"/admin/tokens/{made['id']}", json={"scope": {"operations": ["exec", f"power.{OPS[n]}"]}}),
                root.post(f"/admin/tokens/{made['id']}", json={"scope": {"max_leases": n + 2}}))
            assert first.status_code == second.status_code == 200, (first.text, second.text)
            scope = (await root.get("/admin/tokens")).json()[-1]["scope"]
            assert (scope["operations"], scope["max_leases"], scope["classes"]) == (
                ["exec", f"power.{OPS[n]}"], n + 2, ["sim-board"]), scope

        # a scope stored by an older lab that a bound here no longer takes (a twenty-year lease)
        await rules.store.run("UPDATE tokens SET scope = :s WHERE id = :id", id=made["id"],
                              s='{"classes": ["sim-board"], "max_lease_s": 630720000}')
        agent = client(token=made["token"])
        for refused in (await agent.get("/whoami"), await agent.post("/leases", json={"device": "b0"})):
            assert refused.status_code == 403 and refused.json()["error"] == "out_of_scope", refused.text
            assert "no longer holds" in refused.json()["message"] and "admin token set" in refused.json()["message"]
        listed = (await root.get("/admin/tokens")).json()[-1]
        assert listed["scope"] == {"classes": ["sim-board"], "max_lease_s": 630720000}, "the admin sees it as stored"
        assert (await root.get("http://127.0.0.1/")).status_code == 200, "the admins' Tokens table leaves it out"
        kept = await root.post(f"/admin/tokens/{made['id']}", json={"scope": {"max_leases": 2}})
        assert kept.status_code == 422 and kept.json()["message"].startswith("scope.max_lease_s:"), kept.text
        assert (await root.post(f"/admin/tokens/{made['id']}", json={"band": "urgent"})).status_code == 200
        fixed = await root.post(f"/admin/tokens/{made['id']}", json={"scope": {"max_lease_s": 3600}})
        assert fixed.status_code == 200 and fixed.json()["scope"]["classes"] == ["sim-board"], fixed.text
        assert (await agent.get("/whoami")).status_code == 200, "set again: the token works at once"


OPS = ("on", "off", "cycle")


def test_the_command_line_s_words_for_a_scope():
    fields = parse_scope(["class=rpi4,jetson", "class=sim-board", "op=exec,power.cycle", "leases=2", "lease=2h"])
    assert fields == {"classes": ("rpi4", "jetson", "sim-board"), "operations": ("exec", "power.cycle"),
                      "max_leases": 2, "max_lease_s": 7200.0}
    assert parse_scope(["op="]) == {"operations": ()}
    assert parse_budget("120m/day") == {"budget_s": 7200.0, "budget_period": "day"}
    assert parse_budget("10h/token") == {"budget_s": 36000.0, "budget_period": "token"}
    for wrong in (["class"], ["colour=red"], ["leases=two"], ["lease=forever"]):
        with pytest.raises(ValueError):
            parse_scope(wrong)
    with pytest.raises(ValueError, match="longest lease is at most 7d"):
        parse_scope(["lease=3650d"])  # in words, not the model's "less than or equal to 604800"
    for wrong in ("-5m/day", "120m/week", "lots"):
        with pytest.raises(ValueError):
            parse_budget(wrong)
    scope = TokenScope.model_validate(fields | parse_budget("2h/day"))
    assert describe_scope(scope) == "class=rpi4,jetson,sim-board op=exec,power.cycle leases=2 lease=2h"
    assert describe_budget(scope) == "2h/day" and describe_scope(None) == describe_budget(None) == "-"
    assert describe_scope(TokenScope(operations=())) == "op="


def test_out_of_scope_is_the_request_s_and_a_spent_budget_the_lab_s():
    """``with`` exits 2 when its token may not do what it asks, 75 when its budget is spent
    (the lab's: it renews)."""
    assert wrong_request(CoordinatorError(ErrorCode.OUT_OF_SCOPE, "scope: ...", status=403)) is True
    assert wrong_request(CoordinatorError(ErrorCode.BUDGET_SPENT, "budget: ...", status=403)) is False


def test_admin_token_create_set_and_ls_on_the_database(tmp_path):
    from device_loop.cli.admin import admin_group

    def run(*args: str) -> str:
        done = CliRunner().invoke(admin_group, ["token", *args, "--data-dir", str(tmp_path)], obj={})
        assert done.exit_code == 0, done.output
        return done.output

    made = run("create", "agent-1", "--kind", "agent", "--scope", "op=exec,power.cycle", "--scope", "leases=2",
               "--scope", "lease=2h", "--budget", "120m/day", "--band", "background")
    token_id = made.split()[1]
    assert f"{token_id}: band background; scope op=exec,power.cycle leases=2 lease=2h; budget 2h/day" in made
    listed = run("ls")
    assert "background" in listed and "op=exec,power.cycle leases=2 lease=2h" in listed and "2h/day" in listed
    changed = run("set", token_id, "--scope", "op=exec", "--no-limit", "leases", "--band", "urgent")
    assert changed.strip() == f"{token_id}: band urgent; scope op=exec lease=2h; budget 2h/day"
    assert run("set", token_id, "--unscoped").strip() == f"{token_id}: band urgent; scope -; budget -"
    for args, says in [(["create", "a2", "--scope", "colour=red"], "--scope"),
                       (["create", "a2", "--budget", "-5m/day"], "--budget"),
                       (["set", token_id], "say what to change")]:
        done = CliRunner().invoke(admin_group, ["token", *args, "--data-dir", str(tmp_path)], obj={})
        assert done.exit_code == 2 and says in done.output, done.output
    refused = CliRunner().invoke(admin_group, ["token", "create", "a2", "--scope", "class=nope", "--data-dir",
                                               str(tmp_path)], obj={})
    assert refused.exit_code == 1 and "scope.classes: no device has class 'nope'" in refused.output


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_a_scoped_agent_over_mcp_and_its_scope_widened_at_once(tmp_path):
    """An agent's token allowed settle: through MCP its lease and settle work, another
    operation and a power action are refused naming its scope; an admin widens the scope
    (the call ``admin token set`` makes) and the same token, in the same session, runs it."""
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        root = await _lab_with_root(client, rules)
        made = (await root.post("/admin/tokens", json={"user": "agent-1", "kind": "agent",
                                                        "scope": {"operations": ["settle"]}})).json()
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=client.app),
                                  headers={"Authorization": f"Bearer {made['token']}"}, timeout=30)
        async with Client(streamable_http_client("http://127.0.0.1/mcp", http_client=http)) as agent:
            async def call(tool: str, **args):
                result = await agent.call_tool(tool, args)
                return result.content[0].text if result.is_error else result.structured_content

            lease = await call("reserve", device="b0")
            assert lease["holder"] == "agent-1", lease
            assert (await call("settle", lease_id=lease["id"]))["kind"] == "settle"
            assert (await call("start_operation", lease_id=lease["id"], kind="count")).endswith(
                "scope: this token may run settle; not count [out_of_scope]")
            assert (await call("power", lease_id=lease["id"], action="off")).endswith(
                "scope: this token may run settle; not power.off [out_of_scope]")

            widened = await root.post(f"/admin/tokens/{made['id']}", json={"scope": {"operations": ["settle",
                                                                                                    "count"]}})
            assert widened.status_code == 200, widened.text
            started = await call("start_operation", lease_id=lease["id"], kind="count")
            assert started["kind"] == "count" and started["state"] == "queued", started
            assert "not power.off [out_of_scope]" in await call("power", lease_id=lease["id"], action="off")


@pytest.mark.anyio
async def test_what_admin_token_create_and_set_send_the_coordinator_takes(tmp_path, monkeypatch):
    """The command line's bodies (through the coordinator, not the database) are what its
    calls take: each is sent to an in-process lab as the admin's, and does what the options said."""
    from device_loop.cli.admin import admin_group
    from device_loop.client.http import Coordinator

    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr(Coordinator, "post", lambda self, path, body=None, **kw: sent.append((path, body)) or {
        "id": "tok-1", "user": "agent-1", "admin": False, "host": None, "token": "dl_x"})
    for args in (["create", "agent-1", "--kind", "agent", "--scope", "class=sim-board", "--scope", "op=exec,count",
                  "--scope", "lease=2h", "--budget", "10h/token", "--band", "background"],
                 ["set", "TOKEN", "--scope", "op=exec", "--no-limit", "lease", "--band", "urgent"]):
        done = CliRunner().invoke(admin_group, ["token", *args], obj={"coordinator": "http://127.0.0.1:9",
                                                                      "user": None})
        assert done.exit_code == 0, done.output
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        root = await _lab_with_root(client, rules)
        (create_path, create_body), (set_path, set_body) = sent
        made = await root.post(create_path.removeprefix("/"), json=create_body)
        assert made.status_code == 201, made.text
        assert made.json()["scope"] | {} == {"classes": ["sim-board"], "tags": None, "operations": ["exec", "count"],
                                            "max_leases": None, "max_lease_s": 7200.0, "budget_s": 36000.0,
                                            "budget_period": "token"}
        changed = await root.post(set_path.replace("TOKEN", made.json()["id"]).removeprefix("/"), json=set_body)
        assert changed.status_code == 200, changed.text
        assert (changed.json()["band"], changed.json()["scope"]["operations"], changed.json()["scope"]["max_lease_s"],
                changed.json()["scope"]["budget_s"]) == ("urgent", ["exec"], None, 36000.0)
