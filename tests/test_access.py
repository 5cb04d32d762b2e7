"""Who may call what: every route is called without credentials, with a bad token, and
with each kind of token, and held to the route table (docs/architecture.md, "Identity")."""
import getpass
import re

import pytest

from conftest import SQLITE_ONLY
from device_loop.coordinator.identity import issue_token
from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]

# the rules here run the same SQL on either database, which the store's own tests, the
# statement counts and the OpenAPI run check on PostgreSQL: SQLite only (docs/architecture.md, "Testing")
DATABASES = SQLITE_ONLY


def concrete(path: str) -> str:
    """A URL of the route (absolute: not every route is under the clients' /api/v1)."""
    return "http://127.0.0.1" + re.sub(r"\{[^}]+\}", lambda m: {"{name}": "host-a"}.get(m.group(0), "x"), path)


async def tokens(rules, **kinds):
    return {name: (await issue_token(rules.store, rules.clock, **spec))["token"] for name, spec in kinds.items()}


# Who may call what, written out here on purpose: the app's own table must agree with it.
EXPECTED = {
    ("GET", "/api/v1/health"): "anyone", ("GET", "/api/v1/devices"): "anyone",
    ("GET", "/api/v1/openapi.json"): "anyone",
    ("GET", "/api/v1/devices/{name}"): "anyone", ("GET", "/api/v1/devices/{name}/log"): "anyone",
    ("GET", "/api/v1/hosts"): "anyone",
    ("POST", "/api/v1/hosts/{name}/heartbeat"): "exporter", ("GET", "/api/v1/hosts/{name}/desired"): "exporter",
    ("POST", "/api/v1/leases"): "user", ("GET", "/api/v1/leases"): "user",
    ("GET", "/api/v1/leases/{lease_id}"): "user", ("GET", "/api/v1/leases/{lease_id}/cdi"): "user", ("POST", "/api/v1/leases/{lease_id}/renew"): "user",
    ("POST", "/api/v1/leases/{lease_id}/release"): "user",
    ("POST", "/api/v1/admin/tokens"): "admin", ("GET", "/api/v1/admin/tokens"): "admin",
    ("POST", "/api/v1/admin/tokens/{token_id}/revoke"): "admin", ("POST", "/api/v1/admin/tokens/{token_id}"): "admin",
    ("POST", "/api/v1/admin/leases/{lease_id}/revoke"): "admin",
    ("POST", "/api/v1/admin/devices/{device}/retire"): "admin", ("POST", "/api/v1/admin/hosts/{host}/drain"): "admin",
    ("POST", "/api/v1/admin/forget"): "admin",
    ("GET", "/api/v1/admin/audit"): "admin", ("GET", "/api/v1/admin/candidates"): "admin",
    ("POST", "/api/v1/admin/candidates/{identifier:path}/adopt"): "admin",
    ("POST", "/api/v1/images"): "user", ("GET", "/api/v1/images"): "user", ("GET", "/api/v1/images/{ref}"): "user",
    ("POST", "/api/v1/images/{ref}/remove"): "user",
    ("POST", "/api/v1/admin/images/{ref}/known-good"): "admin", ("POST", "/api/v1/admin/images/gc"): "admin",
    ("GET", "/api/v1/devices/{name}/flashes"): "anyone", ("GET", "/api/v1/hosts/{name}/images/{sha256}"): "exporter",
    ("POST", "/api/v1/leases/{lease_id}/flash"): "user", ("POST", "/api/v1/leases/{lease_id}/recover"): "user",
    ("POST", "/api/v1/leases/{lease_id}/operations"): "user", ("GET", "/api/v1/devices/{name}/operations"): "anyone",
    ("GET", "/api/v1/ops/{op_id}"): "user", ("POST", "/api/v1/admin/devices/{device}/recover"): "admin",
    ("GET", "/api/v1/tickets"): "user", ("GET", "/api/v1/tickets/{ticket_id}"): "user", ("GET", "/api/v1/whoami"): "user",
    ("POST", "/api/v1/tickets/{ticket_id}/cancel"): "user", ("POST", "/api/v1/tickets/{ticket_id}/claim"): "user", ("GET", "/api/v1/queue"): "anyone",
    ("POST", "/api/v1/leases/{lease_id}/settle"): "user",
    ("POST", "/api/v1/leases/{lease_id}/power"): "user", ("POST", "/api/v1/admin/devices/{device}/power"): "admin",
    ("POST", "/api/v1/admin/devices/{device}/clear-fault"): "admin",
    ("POST", "/api/v1/admin/devices/{device}/fault"): "admin",
    ("POST", "/api/v1/admin/devices/{device}/orphans/kill"): "admin",
    ("POST", "/api/v1/jobs"): "user", ("GET", "/api/v1/jobs"): "user", ("POST", "/api/v1/jobs/claim"): "user",
    ("GET", "/api/v1/jobs/{job_id}"): "user", ("POST", "/api/v1/jobs/{job_id}/beat"): "user",
    ("POST", "/api/v1/jobs/{job_id}/reserve"): "user", ("POST", "/api/v1/jobs/{job_id}/cells"): "user",
    ("POST", "/api/v1/jobs/{job_id}/runs"): "user", ("POST", "/api/v1/jobs/{job_id}/finish"): "user",
    ("POST", "/api/v1/jobs/{job_id}/cancel"): "user", ("GET", "/api/v1/jobs/{job_id}/runs"): "user",
    ("POST", "/api/v1/jobs/{job_id}/delete"): "user", ("GET", "/api/v1/jobs/{job_id}/evidence"): "user",
    ("POST", "/mcp"): "tools",  # each tool checks its caller: tests/test_mcp.py calls them all
    # the board's event stream and metrics are public like GET /api/v1/devices; so are the
    # web pages, which act only through the routes above (tests/test_web.py)
    ("GET", "/api/v1/events"): "anyone", ("GET", "/metrics"): "anyone",
    ("GET", "/"): "anyone", ("GET", "/devices/{name}"): "anyone", ("GET", "/static/{file}"): "anyone",
    ("POST", "/login"): "anyone", ("POST", "/logout"): "anyone",
    ("GET", "/jobs"): "anyone", ("GET", "/jobs/{job_id}"): "anyone",  # a job's page only to who may read it
}
ALLOWED = {"anyone": {"nobody", "user", "host-a", "host-b", "admin"}, "user": {"user", "admin"},
           "exporter": {"host-a", "admin"}, "admin": {"admin"}}


async def test_every_route_is_held_to_the_table(tmp_path):
    from device_loop.coordinator.app import create_app  # the app's real routes, not the table
    app = create_app("sqlite:///:memory:")
    served = {(m, r.path) for r in app.routes for m in (r.methods or {"ANY"}) if m != "HEAD"}
    assert served == set(EXPECTED), "a route was added or removed: decide who may call it, here"
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        t = await tokens(rules, user={"username": "carol"}, admin={"username": "root", "admin": True},
                         **{"host-a": {"host": "host-a"}, "host-b": {"host": "host-b"}})
        callers = {"nobody": client(), "forged": client(token="dl_not-a-real-token"),
                   **{name: client(token=token) for name, token in t.items()}}
        for (method, path), access in EXPECTED.items():
            if access == "tools":
                continue
            url = concrete(path)
            for name, caller in callers.items():
                status = (await caller.request(method, url, json={})).status_code
                if name in ALLOWED[access]:
                    assert status not in (401, 403), f"{name} refused on {method} {path}"
                else:
                    assert status == (401 if name in ("nobody", "forged") else 403), \
                        f"{name} got {status} on {method} {path}"


async def test_no_public_answer_carries_a_lease_secret(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        t = await tokens(rules, alice={"username": "alice"}, exporter={"host": "host-a"})
        alice, exporter = client(token=t["alice"]), FakeExporter(client(token=t["exporter"]), "host-a")
        await exporter.beat([device("b0")])
        lease = (await alice.post("/leases", json={"device": "b0"})).json()
        await exporter.serve(lease)
        secret = (await alice.get(f"/leases/{lease['id']}")).json()["endpoints"][0]["secret"]
        assert secret
        anyone = client()
        for (method, path), access in EXPECTED.items():
            if access == "anyone":
                answer = await anyone.request(method, concrete(path).replace("host-a", "b0"))
                assert secret not in answer.text, f"{path} shows the secret"


async def test_each_kind_of_token_reaches_only_its_routes(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        t = await tokens(rules, alice={"username": "alice"}, root={"username": "root", "admin": True},
                         host_a={"host": "host-a"}, host_b={"host": "host-b"})
        alice, root = client(token=t["alice"]), client(token=t["root"])
        exporter_a, exporter_b = client(token=t["host_a"]), client(token=t["host_b"])
        assert (await FakeExporter(exporter_a, "host-a").beat([device("b0")])).status_code == 200
        refused = await FakeExporter(exporter_b, "host-a").beat([device("b0")])
        assert refused.status_code == 403 and "exporter token of host host-a" in refused.json()["message"]
        assert (await FakeExporter(alice, "host-a").beat([device("b0")])).status_code == 403
        assert (await exporter_a.post("/leases", json={"device": "b0"})).status_code == 403
        assert (await alice.get("/admin/tokens")).status_code == 403
        listed = await root.get("/admin/tokens")
        assert listed.status_code == 200 and all("token" not in row and "hash" not in row for row in listed.json())

        # the header that names the caller in trust mode means nothing here
        alice.headers["X-Device-Loop-User"] = "mallory"
        alice.headers["X-Forwarded-For"] = "10.9.9.9"
        lease = (await alice.post("/leases", json={"device": "b0"})).json()
        assert lease["holder"] == "alice"


async def test_revoked_and_expired_tokens_stop_working(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        root = client(token=(await issue_token(rules.store, rules.clock, "root", admin=True))["token"])
        made = (await root.post("/admin/tokens", json={"user": "bob", "expires_s": 3600})).json()
        assert made["token"].startswith("dl_") and made["expires_at"]
        bob = client(token=made["token"])
        assert (await bob.get("/leases")).status_code == 200
        clock.advance(3601)
        assert (await bob.get("/leases")).json()["error"] == "bad_token"

        carol = (await root.post("/admin/tokens", json={"user": "carol"})).json()
        assert (await client(token=carol["token"]).get("/leases")).status_code == 200
        assert (await root.post(f"/admin/tokens/{carol['id']}/revoke")).status_code == 200
        assert (await client(token=carol["token"]).get("/leases")).status_code == 401
        assert (await root.post("/admin/tokens/tok-nope/revoke")).status_code == 404
        both = await root.post("/admin/tokens", json={"user": "x", "exporter_host": "h"})
        assert both.status_code == 422


async def test_admins_act_on_any_lease_and_every_action_is_audited(tmp_path):
    async with in_process_lab(tmp_path, single_user=False, max_leases_per_user=1) as (client, rules, clock):
        t = await tokens(rules, alice={"username": "alice"}, root={"username": "root", "admin": True},
                         exporter={"host": "host-a"})
        alice, root = client(token=t["alice"]), client(token=t["root"])
        exporter = FakeExporter(client(token=t["exporter"]), "host-a")
        await exporter.beat([device("b0"), device("b1"), device("b2")])
        lease = (await alice.post("/leases", json={"device": "b0"})).json()
        hoard = await alice.post("/leases", json={"device": "b1"})
        assert hoard.status_code == 409 and hoard.json()["error"] == "too_many_leases" and "b0" in hoard.json()["message"]
        assert (await root.post(f"/leases/{lease['id']}/renew", json={"ttl_s": 120})).status_code == 200

        revoked = (await root.post(f"/admin/leases/{lease['id']}/revoke")).json()
        assert revoked["state"] == "revoked" and revoked["end_reason"] == "revoked by admin root"
        assert (await alice.post(f"/admin/leases/{lease['id']}/revoke")).status_code == 403

        leased = (await root.post("/leases", json={"device": "b1"})).json()
        refused = await root.post("/admin/devices/b1/retire", json={})
        assert refused.status_code == 409 and "--force" in refused.json()["message"]
        retired = (await root.post("/admin/devices/b1/retire", json={"force": True})).json()
        assert (await root.get(f"/leases/{leased['id']}")).json()["state"] == "revoked"
        assert retired["state"] == "retired"
        assert (await alice.post("/leases", json={"device": "b1"})).json()["error"] == "retired"
        await exporter.beat([device("b0"), device("b1"), device("b2")])  # it ran nothing for the revoked lease
        assert (await root.post("/admin/devices/b1/retire", json={"retired": False})).json()["state"] == "idle"

        drained = (await root.post("/admin/hosts/host-a/drain", json={})).json()
        assert drained["draining"] is True
        refused = await alice.post("/leases", json={"device": "b2"})
        assert refused.status_code == 409 and refused.json()["error"] == "draining"
        await root.post("/admin/hosts/host-a/drain", json={"draining": False})
        assert (await alice.post("/leases", json={"device": "b2"})).status_code == 201

        actions = [(a["actor"], a["action"]) for a in (await root.get("/admin/audit")).json()]
        for expected in [("root", "revoke"), ("root", "retire"), ("root", "unretire"), ("root", "drain"),
                         ("root", "undrain"), ("root", "renew"), ("alice", "reserve")]:
            assert expected in actions


async def test_in_the_trust_mode_who_does_not_say_is_the_lab_owner(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        await FakeExporter(client(), "host-a").beat([device("b0")])
        agent = client(user="")  # an MCP client sends no user header; the CLI sends the login name
        lease = (await agent.post("/leases", json={"device": "b0"})).json()
        assert lease["holder"] == getpass.getuser()
        assert (await client(user=getpass.getuser()).get(f"/leases/{lease['id']}")).status_code == 200
