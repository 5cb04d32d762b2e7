"""The web page, its sign-in and CSRF guard, the event stream and metrics, over HTTP: in
process on SQLite and PostgreSQL, and against real coordinator processes (the stream, one
change through one process seen by a viewer of another, ``device-loop watch``). The
browser drives the page in tests/test_web_browser.py."""
import asyncio
import json
import re
import signal
import subprocess
import sys
from contextlib import asynccontextmanager

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import SQLITE_ONLY, SRC, WAIT_S, Coordinator, lab_tokens, sim_devices
from device_loop.coordinator import events
from device_loop.coordinator.events import Broadcaster
from device_loop.coordinator.identity import csrf_token, issue_token
from device_loop.coordinator.web.pages import device_row, queue_row
from device_loop.coordinator.who import Who
from device_loop.core.vocabulary import TokenKind
from lab_in_process import FakeExporter, device, in_process_lab, leased_board
from helpers import run_cli, wait_state
from test_flash_rules import board, flash_report, lab_with_board
from test_steps_rules import COOLDOWN, REBOOT, desired_ops, op_report, stepped

pytestmark = [pytest.mark.service, pytest.mark.anyio, pytest.mark.timeout(90)]

# the rules here run the same SQL on either database, which the store's own tests, the
# statement counts and the OpenAPI run check on PostgreSQL: SQLite only (docs/architecture.md, "Testing")
DATABASES = SQLITE_ONLY
SITE = "http://127.0.0.1"  # the in-process clients' base URL is SITE/api/v1


# ---- the pages ------------------------------------------------------------------------------


@pytest.mark.usefixtures("database")
async def test_the_board_and_a_device_page_show_the_lab(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, exporter, lease = await leased_board(client)
        rogue = {"lease": lease["id"], "device": "b0", "identifier": "sim:b0", "kind": "uart",
                 "endpoints": [{"kind": "uart", "host": "127.0.0.1", "port": 4000, "command": "nc {host} {port}"},
                               {"kind": "vnc-web", "host": "127.0.0.1", "port": 4001, "url": "javascript:alert(1)"}]}
        tagged = {**device("b1", health="failed"), "tags": ["<b>bold</b>"]}
        await exporter.beat([device("b0"), tagged], [rogue], [lease["id"]])

        page = await api.get(f"{SITE}/")
        assert page.status_code == 200 and page.headers["cache-control"] == "no-store"
        html = page.text
        assert "Single-user trust mode" in html and 'name="device-loop-user" content="alice"' in html
        assert '<tr data-name="b0" data-state="in_use" data-holder="alice">' in html
        assert '<tr data-name="b1" data-state="faulty" data-holder="">' in html and "uart: broken" in html
        assert "&lt;b&gt;bold&lt;/b&gt;" in html and "<b>bold</b>" not in html, "what exporters report is escaped"
        assert f'data-lease="{lease["id"]}"' in html, "the viewer's lease, with its endpoints"
        assert '<code><span class="word">127.0.0.1:4000</span></code>' in html  # (words never broken inside)
        assert '<code><span class="word">nc</span> <span class="word">127.0.0.1</span> <span class="word">4000</span>' \
               '</code>' in html
        assert "javascript:" not in html and "Open screen" not in html, "only http(s) URLs are linked"
        assert (await client("bob").get(f"{SITE}/")).text.count("data-lease=") == 0, "bob holds nothing"

        shown = (await api.get(f"{SITE}/devices/b0")).text
        assert shown.count("<tr data-name=") == 1 and "reserved (30m)" in shown and "services up" in shown
        assert "Known-good image" not in shown and "Flashes" not in shown, "b0 has no flash target"
        assert 'data-act="retire"' in shown, "the trust mode's owner may do what admins do"
        missing = await api.get(f"{SITE}/devices/nope")
        assert missing.status_code == 404 and "No device is called nope" in missing.text

        clock.advance(60)
        await rules.reap()  # host-a said nothing for a minute: offline since now
        offline = (await api.get(f"{SITE}/")).text
        since = (await api.get("/devices/b1")).json()["state_since"]
        assert '<tr data-name="b1" data-state="offline"' in offline
        assert f'since <time datetime="{since}" data-ago>' in offline and since.endswith(":01:00Z")

        for name, kind in (("lab.css", "text/css"), ("lab.js", "text/javascript")):
            static = await api.get(f"{SITE}/static/{name}")
            assert static.status_code == 200 and static.headers["content-type"].startswith(kind)
        assert (await api.get(f"{SITE}/static/../app.py")).status_code == 404


@pytest.mark.usefixtures("database")
async def test_a_device_page_shows_its_flashes_and_known_good_image(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, exporter, lease = await lab_with_board(client)
        op = (await api.post(f"/leases/{lease['id']}/flash", json={"image": "build-7"})).json()
        await exporter.beat([board(), board("b1")], operations=[flash_report(op, "failed", "writing", 4096, "torn")])
        page = (await api.get(f"{SITE}/devices/b0")).text
        flashes = section(page, '<section class="flashes"')
        assert "build-7" in flashes and '<span class="op o-failed">failed</span> <span class="why">torn</span>' in flashes
        assert "needs recovery" in page
        assert "<b>golden</b>" in page and '<span class="word">recover</span> <span class="word">b0</span>' in page, \
            "the known-good image of its class"
        assert "Known-good image" in page, "b0 has a flash target"
        assert 'data-act="known-good" data-image=' in page and 'data-for="device:b0"' in page


async def people(client, rules, *names: str, agents=()) -> dict:
    """A client with a token of each of ``names`` (``root`` an admin; ``agents`` an agent's),
    and ``host-a``, an exporter's."""
    made = {name: client(token=(await issue_token(rules.store, rules.clock, name, admin=name == "root",
                                                  kind=TokenKind.AGENT if name in agents else TokenKind.PERSON))
                         ["token"]) for name in names}
    return made | {"host-a": client(token=(await issue_token(rules.store, rules.clock, host="host-a"))["token"])}


def section(html: str, start: str) -> str:
    """The part of a page from ``start`` to the end of the element it opens (no nesting of its kind)."""
    at = html.index(start)
    tag = start[1:].split(" ", 1)[0]
    return html[at:html.index(f"</{tag}>", at)]


@pytest.mark.usefixtures("database")
async def test_the_board_shows_the_queue_to_anyone_and_their_tickets_to_each(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        who = await people(client, rules, "alice", "bob", "carol", "root", "bot", agents=("bot",))
        exporter = FakeExporter(who["host-a"], "host-a")
        tagged = {**device("b0"), "tags": ["<b>bold</b>"]}
        await exporter.beat([tagged, {**device("x0"), "class": "other"}])
        lease = (await who["alice"].post("/leases", json={"device": "b0"})).json()
        bob = (await who["bob"].post("/leases", json={"class": "sim-board", "tags": ["<b>bold</b>"],
                                                      "queue": True})).json()
        assert (bob["state"], bob["position"]) == ("waiting", 1), bob
        clock.advance(90)
        carol = (await who["carol"].post("/leases", json={"device": "b0", "queue": True})).json()
        bot = (await who["bot"].post("/leases", json={"class": "sim-board", "tags": ["<b>bold</b>"],
                                                      "queue": True})).json()
        assert bot["kind"] == "batch"
        ids = {bob["ticket"], carol["ticket"], bot["ticket"]}

        anyone = (await client(user="").get(f"{SITE}/")).text
        queue = section(anyone, '<section id="queue"')
        assert "hidden" not in queue.split(">", 1)[0] and queue.count('<tr data-requester=') == 3
        assert '<tr data-requester="bob">' in queue
        assert "any device of class sim-board with tag &lt;b&gt;bold&lt;/b&gt;" in queue
        assert "<b>bold</b>" not in anyone, "what exporters report and users ask is escaped"
        assert '<a href="/devices/b0">b0</a>' in queue, "carol's ticket is for b0 by name"
        assert '<time data-waited="90.0">1m</time>' in queue and '<span class="kind k-batch">batch</span>' in queue
        assert not any(i in anyone for i in ids), "nobody's ticket id on the public board"

        mine = (await who["bob"].get(f"{SITE}/")).text
        panel = section(mine, '<div id="tickets"')
        assert f'data-ticket="{bob["ticket"]}" data-state="waiting"' in panel and 'data-act="cancel-ticket"' in panel
        assert 'Number <b class="position">1</b> in the queue (interactive)' in panel
        assert carol["ticket"] not in mine and bot["ticket"] not in mine, "only their own ticket's id"
        assert 'class="reserve-any when-can-act"' in mine and '<option value="other">' in mine
        assert 'data-act="queue"' in mine and 'data-act="reserve-any"' in mine
        root = (await who["root"].get(f"{SITE}/")).text
        assert not any(i in root for i in ids), "an admin's board is everyone's too (the stream is)"

        page = (await who["carol"].get(f"{SITE}/devices/b0")).text
        assert section(page, '<section id="queue"').count("<tr data-requester=") == 3, "b0 may serve all three"
        assert f'data-ticket="{carol["ticket"]}"' in page and bob["ticket"] not in page
        other = (await who["carol"].get(f"{SITE}/devices/x0")).text
        assert 'id="queue" class="queue" hidden' in other and "<tr data-requester=" not in other, \
            "x0 serves none of them"
        assert 'value="other"' in other, "a device's page reserves any of its class"

        cancelled = (await who["carol"].post(f"/tickets/{carol['ticket']}/cancel")).json()
        assert cancelled["state"] == "cancelled"
        assert carol["ticket"] not in (await who["carol"].get(f"{SITE}/")).text, "an ended ticket is gone"

        await who["alice"].post(f"/leases/{lease['id']}/release")
        await exporter.beat([tagged, {**device("x0"), "class": "other"}])  # reclaimed: granted to bob, a person
        offered = section((await who["bob"].get(f"{SITE}/")).text, '<div id="tickets"')
        assert f'data-ticket="{bob["ticket"]}" data-state="granted"' in offered and 'data-act="claim-ticket"' in offered
        assert (await rules.scheduler.tickets_sql.ticket(bob["ticket"]))["state"] == "granted", "the board claims nothing"
        assert (await who["bob"].post(f"/tickets/{bob['ticket']}/claim")).json()["state"] == "claimed"  # "Take it"
        board_page = (await who["bob"].get(f"{SITE}/")).text
        assert 'data-device="b0"' in section(board_page, '<div id="mine"')
        assert "data-ticket=" not in board_page, "a claimed ticket: its lease is all there is to see"
        assert (await who["bob"].get(f"/tickets/{bob['ticket']}")).json()["state"] == "claimed"
        assert section((await client(user="").get(f"{SITE}/")).text, '<section id="queue"').count("<tr ") == 1


@pytest.mark.usefixtures("database")
async def test_the_page_offers_a_granted_ticket_and_only_taking_it_claims_it(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        who = await people(client, rules, "alice", "bob")
        exporter = FakeExporter(who["host-a"], "host-a")
        await exporter.beat([device("b0"), {**device("b1"), "class": "other"}])
        lease = (await who["alice"].post("/leases", json={"device": "b0"})).json()
        ticket = (await who["bob"].post("/leases", json={"class": "sim-board", "queue": True})).json()
        await who["alice"].post(f"/leases/{lease['id']}/release")
        await exporter.beat([device("b0"), {**device("b1"), "class": "other"}])
        assert (await rules.scheduler.tickets_sql.ticket(ticket["ticket"]))["state"] == "granted"
        elsewhere = (await who["bob"].get(f"{SITE}/devices/b1")).text  # not b0's page: said where it is
        assert (await rules.scheduler.tickets_sql.ticket(ticket["ticket"]))["state"] == "granted", "a board left open holds nothing"
        panel = section(elsewhere, '<div id="tickets"')
        assert '<a href="/devices/b0">b0</a> is held for you until' in panel
        assert 'data-act="claim-ticket"' in panel and 'data-act="cancel-ticket"' in panel
        assert (await who["bob"].post(f"/tickets/{ticket['ticket']}/claim")).json()["state"] == "claimed"  # "Take it"
        panel = section((await who["bob"].get(f"{SITE}/devices/b1")).text, '<div id="tickets"')
        assert "Granted: your lease on" in panel and '<a href="/devices/b0">b0</a>' in panel
        assert 'data-act="cancel-ticket"' not in panel
        here = (await who["bob"].get(f"{SITE}/devices/b0")).text
        assert "data-ticket=" not in here and 'data-device="b0"' in section(here, '<div id="mine"')


@pytest.mark.usefixtures("database")
async def test_reclaiming_and_faulty_rows_say_why_and_the_holder_may_settle(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        who = await people(client, rules, "alice", "bob", "root")
        host = who["host-a"]
        exporter = FakeExporter(host, "host-a")
        report = stepped(COOLDOWN, REBOOT)
        await exporter.beat([report])
        lease = (await who["alice"].post("/leases", json={"device": "d0"})).json()

        page = (await who["alice"].get(f"{SITE}/devices/d0")).text
        steps = section(page, '<section class="steps"')
        assert "<li>cooldown <small>(settle runs it inside a lease too)</small></li>" in steps
        assert "<li>reboot</li>" in steps
        assert f'data-act="settle" data-lease="{lease["id"]}"' in steps and "(cooldown)" in steps
        assert 'data-act="settle"' not in (await who["bob"].get(f"{SITE}/devices/d0")).text, "not bob's lease"
        assert f'data-act="settle" data-lease="{lease["id"]}"' in (await who["root"].get(f"{SITE}/devices/d0")).text

        op = (await who["alice"].post(f"/leases/{lease['id']}/settle")).json()
        (queued,) = await desired_ops(host)
        hot = "cooling down: 51.2 °C <b>hot</b>, waiting for < 45 °C"
        await exporter.beat([report], operations=[op_report(queued, "running", detail=hot)])
        page = (await who["alice"].get(f"{SITE}/devices/d0")).text
        assert f'<p class="progress" data-op="{op["id"]}" data-op-state="running">settle running: cooling down: ' \
               '51.2 °C &lt;b&gt;hot&lt;/b&gt;, waiting for &lt; 45 °C</p>' in page, "its progress, escaped"
        assert "<b>hot</b>" not in page
        operations = section(page, '<table class="operations"')
        assert '<span class="why">cooling down: 51.2 °C &lt;b&gt;hot&lt;/b&gt;' in operations, "and in its row"
        assert 'data-op="' not in (await who["bob"].get(f"{SITE}/devices/d0")).text, "only for who may settle"
        await exporter.beat([report], operations=[op_report(queued, "done", "44 °C: settled")])
        assert 'class="progress"' not in (await who["alice"].get(f"{SITE}/devices/d0")).text, "shown until done"

        await who["alice"].post(f"/leases/{lease['id']}/release")
        await exporter.beat([report])  # its services are gone: the steps begin
        (cooldown,) = await desired_ops(host)
        await exporter.beat([report], operations=[op_report(cooldown, "running", detail=hot)])
        why = "step 1/2 cooldown: cooling down: 51.2 °C &lt;b&gt;hot&lt;/b&gt;, waiting for &lt; 45 °C"
        row = section((await who["bob"].get(f"{SITE}/")).text, '<tr data-name="d0"')
        assert 'data-state="reclaiming"' in row and f'<span class="why">{why}</span>' in row
        assert why in device_row((await who["bob"].get("/devices/d0")).json()), "the stream's row, the same"
        page = (await who["bob"].get(f"{SITE}/devices/d0")).text
        assert '<li class="running">cooldown <small>(settle runs it inside a lease too)</small>: <span class="why">' \
               'cooling down: 51.2 °C &lt;b&gt;hot&lt;/b&gt;' in page
        assert 'data-act="settle"' not in page, "no lease to settle"

        await exporter.beat([report], operations=[op_report(cooldown, "failed", "still 52.0 °C <i>after</i> 10m")])
        fault = "step 1/2 cooldown failed: still 52.0 °C &lt;i&gt;after&lt;/i&gt; 10m"
        row = section((await who["bob"].get(f"{SITE}/")).text, '<tr data-name="d0"')
        assert 'data-state="faulty"' in row and f'<span class="why">{fault}</span>' in row
        assert 'data-act="clear-fault"' not in (await who["bob"].get(f"{SITE}/devices/d0")).text
        admin = (await who["root"].get(f"{SITE}/devices/d0")).text
        assert f'<p class="why bad">{fault} <button type="button" class="small" data-act="clear-fault" ' \
               'data-device="d0">' in admin


# ---- signing in, and the CSRF guard ------------------------------------------------------------


@pytest.mark.usefixtures("database")
async def test_a_token_signs_in_to_an_httponly_cookie_that_needs_the_csrf_header(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        made = {name: (await issue_token(rules.store, rules.clock, **spec))["token"] for name, spec in
                {"alice": {"username": "alice"}, "host-a": {"host": "host-a"}}.items()}
        await FakeExporter(client(token=made["host-a"]), "host-a").beat([device("b0"), device("b1")])
        browser = client(user="")

        for wrong in ("dl_not-a-token", made["host-a"]):  # an exporter's token signs nobody in
            refused = await browser.post(f"{SITE}/login", data={"token": wrong, "next": "/devices/b0"})
            assert refused.status_code == 303 and refused.headers["location"] == "/devices/b0?login=failed"
            assert "set-cookie" not in refused.headers
        failed = (await browser.get(f"{SITE}/?login=failed")).text
        assert "nobody is signed in" in failed and 'action="/login"' in failed

        signed = await browser.post(f"{SITE}/login", data={"token": made["alice"], "next": "//evil.example/"})
        assert signed.status_code == 303 and signed.headers["location"] == "/", "never back to another site"
        cookie = signed.headers["set-cookie"]
        assert cookie.startswith(f"device_loop_token={made['alice']};")
        assert {"HttpOnly", "SameSite=strict", "Path=/"} <= {p.strip() for p in cookie.split(";")}
        assert "Secure" not in cookie, "plain http: a Secure cookie would never come back"
        https = client(user="")
        https.base_url = "https://127.0.0.1/api/v1"
        assert "Secure" in (await https.post("https://127.0.0.1/login", data={"token": made["alice"]}))\
            .headers["set-cookie"]

        page = (await browser.get(f"{SITE}/")).text
        assert "Signed in as <b>alice</b>" in page and 'data-act="logout"' in page
        assert f'name="device-loop-csrf" content="{csrf_token(made["alice"])}"' in page
        assert (await browser.get("/leases")).status_code == 200, "reading needs no CSRF header"

        bare = await browser.post("/leases", json={"device": "b0"})
        assert bare.status_code == 403 and bare.json()["error"] == "csrf"
        forged = await browser.post("/leases", json={"device": "b0"}, headers={"X-Device-Loop-CSRF": csrf_token("dl_x")})
        assert forged.status_code == 403 and forged.json()["error"] == "csrf"
        headers = {"X-Device-Loop-CSRF": csrf_token(made["alice"])}
        elsewhere = await browser.post("/leases", json={"device": "b0"},
                                       headers={**headers, "Origin": "http://evil.example"})
        assert elsewhere.status_code == 403 and elsewhere.json()["error"] == "cross_site"
        reserved = await browser.post("/leases", json={"device": "b0"}, headers=headers)
        assert reserved.status_code == 201 and reserved.json()["holder"] == "alice"
        bearer = await client(token=made["alice"]).post("/leases", json={"device": "b1"})
        assert bearer.status_code == 201, "a bearer token is no cookie: no CSRF header needed"

        navigation = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
        link = await client(user="").get(f"{SITE}/", headers={**navigation, "Sec-Fetch-Dest": "document"})
        assert link.status_code == 200, "a link from another site opens the board"
        assert link.headers["x-frame-options"] == "DENY" and "frame-ancestors 'none'" in \
            link.headers["content-security-policy"], "and no other site shows it in a frame"
        framed = await client(user="").get(f"{SITE}/", headers={**navigation, "Sec-Fetch-Dest": "iframe"})
        assert framed.status_code == 403, "another site's frame could be clicked through"
        api_link = await client(user="").get("/devices", headers={"Sec-Fetch-Site": "cross-site",
                                                                   "Sec-Fetch-Mode": "navigate"})
        assert api_link.status_code == 403

        again = await browser.post(f"{SITE}/login", data={"token": made["alice"]})
        assert again.status_code == 303, "signing in again with a live cookie (no page header) works"
        out = await browser.post(f"{SITE}/logout")
        assert out.status_code == 303 and 'device_loop_token=""' in out.headers["set-cookie"]
        assert 'action="/login"' in (await browser.get(f"{SITE}/")).text

        stale = client(user="")
        stale.cookies.set("device_loop_token", made["alice"])
        token_id = next(t["id"] for t in await rules.admin.tokens() if t["username"] == "alice")
        await rules.admin.tokens_sql.revoke_token(token_id, clock())
        assert 'action="/login"' in (await stale.get(f"{SITE}/")).text, "a revoked token's cookie signs nobody in"
        assert (await stale.post("/leases", json={"device": "b0"}, headers=headers)).status_code == 401


# ---- metrics ---------------------------------------------------------------------------------


def metric(text: str, name: str, **labels) -> float:
    """A sample's value in Prometheus' text format, parsed by prometheus-client's own parser."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise AssertionError(f"no {name} {labels} in:\n{text}")


@pytest.mark.usefixtures("database")
async def test_metrics_parse_and_move_with_leases_and_flashes(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, exporter, _ = await lab_with_board(client, lease_it=False)

        async def scrape() -> str:
            answer = await api.get(f"{SITE}/metrics")
            assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
            return answer.text

        before = await scrape()
        assert metric(before, "device_loop_leases_granted_total") == 0
        assert metric(before, "device_loop_devices", state="idle", **{"class": "sim-board"}) == 2
        assert metric(before, "device_loop_devices", state="faulty", **{"class": "sim-board"}) == 0

        lease = (await api.post("/leases", json={"device": "b0"})).json()
        assert (await client("bob").post("/leases", json={"device": "b0"})).status_code == 409
        with pytest.raises(RuntimeError):
            async with rules.store.tx():
                await rules.leases.reserve("b1", None, Who("bob"))
                raise RuntimeError("rolled back after the reserve")
        clock.advance(2.5)
        service = {"lease": lease["id"], "device": "b0", "identifier": "sim:b0", "kind": "uart",
                   "endpoints": [{"kind": "uart", "host": "127.0.0.1", "port": 4000}]}
        await exporter.beat([board(), board("b1")], [service], [lease["id"]])
        clock.advance(4)
        held = await scrape()
        assert metric(held, "device_loop_leases_granted_total") == 1, "a refused or rolled back reserve: nothing"
        assert metric(held, "device_loop_leases_live", state="active") == 1
        assert metric(held, "device_loop_devices", state="in_use", **{"class": "sim-board"}) == 1
        assert metric(held, "device_loop_reserve_ready_seconds_count") == 1
        assert metric(held, "device_loop_reserve_ready_seconds_sum") == 2.5
        assert metric(held, "device_loop_reserve_ready_seconds_bucket", le="2.5") == 1
        assert metric(held, "device_loop_reserve_ready_seconds_bucket", le="1.0") == 0
        assert metric(held, "device_loop_host_heartbeat_age_seconds", host="host-a") == 4
        assert metric(held, "device_loop_host_online", host="host-a") == 1

        op = (await api.post(f"/leases/{lease['id']}/flash", json={"image": "build-7"})).json()
        await exporter.beat([board(), board("b1")], [service], operations=[flash_report(op, "done", "verifying", 1)])
        await api.post(f"/leases/{lease['id']}/release")
        after = await scrape()
        assert metric(after, "device_loop_operations_total", kind="flash", outcome="done") == 1
        assert metric(after, "device_loop_leases_ended_total", reason="released") == 1
        assert metric(after, "device_loop_leases_live", state="active") == 0
        assert metric(after, "device_loop_devices", state="reclaiming", **{"class": "sim-board"}) == 1


async def test_the_grafana_dashboard_asks_only_for_metrics_there_are(tmp_path):
    dashboard = json.loads((SRC / "docs" / "grafana-dashboard.json").read_text())
    asked = {re.sub(r"_(total|bucket|sum|count)$", "", name) for panel in dashboard["panels"]
             for target in panel["targets"] for name in re.findall(r"device_loop_\w+", target["expr"])}
    async with in_process_lab(tmp_path) as (client, rules, clock):
        scraped = (await client().get(f"{SITE}/metrics")).text
    there = {family.name for family in text_string_to_metric_families(scraped)}
    assert len(asked) == 8 and asked <= there, f"the dashboard asks for what /metrics lacks: {asked - there}"


# ---- the event stream ------------------------------------------------------------------------


def frames(raw: bytes) -> list[tuple[str, object]]:
    """(event, data) of each server-sent event in what one read of the stream sent."""
    events = [dict(line.split(": ", 1) for line in text.split("\n")) for text in raw.decode().strip().split("\n\n")]
    return [(fields["event"], json.loads(fields["data"])) for fields in events]


def frame(raw: bytes) -> tuple[str, object]:
    """(event, data) of the one server-sent event ``raw`` holds."""
    (only,) = frames(raw)
    return only


@pytest.mark.usefixtures("database")
async def test_one_read_and_one_rendering_per_change_whatever_the_number_of_viewers(tmp_path, monkeypatch):
    monkeypatch.setattr(events, "BACKLOG", 3)
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([device("b0"), device("b1")])
        reads, rendered, read_devices = [], [], rules.devices.devices_sql.devices

        async def counted_read():
            reads.append(1)
            return await read_devices()

        def counted_row(d: dict) -> str:
            rendered.append(d["name"])
            return device_row(d)

        monkeypatch.setattr(rules.devices.devices_sql, "devices", counted_read)
        broadcaster = Broadcaster(rules.devices.list_devices, rules.life.notifier, counted_row)
        viewers = [broadcaster.stream(html=n % 2 == 0) for n in range(40)]
        asleep = broadcaster.stream()  # a viewer that reads nothing more
        for stream in [*viewers, asleep]:
            assert (await anext(stream)).startswith(b"retry: ")
        snapshots = [frame(await asyncio.wait_for(anext(stream), WAIT_S)) for stream in viewers]
        assert {event for event, _ in snapshots} == {"snapshot"}
        assert [d["name"] for d in snapshots[1][1]] == ["b0", "b1"] and "html" not in snapshots[1][1][0]
        assert snapshots[0][1][0]["html"].startswith('<tr data-name="b0" data-state="idle"')
        assert len(reads) == 1 and sorted(rendered) == ["b0", "b1"]

        for n, path, body in [(1, "/leases", {"device": "b0"}), (2, "/leases", {"device": "b1"}),
                              (3, "/admin/devices/b1/retire", {"force": True})]:
            assert (await api.post(path, json=body)).status_code in (200, 201)
            changes = [frame(await asyncio.wait_for(anext(stream), WAIT_S)) for stream in viewers]
            assert len({json.dumps(c) for c in changes[0::2]}) == len({json.dumps(c) for c in changes[1::2]}) == 1
            assert len(reads) == 1 + n, "one read per change"
        assert rendered[2:] == ["b0", "b1", "b1"], "each changed row rendered once, for 20 viewers"
        event, data = changes[1]
        assert (event, data["name"], data["state"], "html" in data) == ("device", "b1", "retired", False)
        assert changes[0][1]["html"].startswith('<tr data-name="b1" data-state="retired"')

        with pytest.raises(StopAsyncIteration):  # 3 events behind: dropped (a browser reconnects)
            await asyncio.wait_for(anext(asleep), WAIT_S)

        monkeypatch.setattr(events, "KEEPALIVE_S", 0.05)
        assert await asyncio.wait_for(anext(viewers[1]), WAIT_S) == b": keepalive\n\n"
        # ... and after a keepalive the stream goes on: the next change still comes
        assert (await api.post("/admin/devices/b0/retire", json={"force": True})).status_code == 200
        while (said := await asyncio.wait_for(anext(viewers[1]), WAIT_S)) == b": keepalive\n\n":
            pass
        assert frame(said)[1]["name"] == "b0" and frame(said)[1]["state"] == "retired"
        for stream in viewers:
            await stream.aclose()
        await broadcaster.close()


@pytest.mark.usefixtures("database")
async def test_every_change_the_board_shows_reaches_the_stream(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, exporter, _ = await lab_with_board(client, lease_it=False)
        broadcaster = Broadcaster(rules.devices.list_devices, rules.life.notifier)
        stream = broadcaster.stream()
        await anext(stream)

        pending: list[tuple[str, object]] = []

        async def next_change() -> dict:
            if not pending:  # the changes of one read come together
                pending.extend(frames(await asyncio.wait_for(anext(stream), WAIT_S)))
            event, data = pending.pop(0)
            assert event == "device"
            return data

        assert frame(await anext(stream))[0] == "snapshot"
        lease = (await api.post("/leases", json={"device": "b1"})).json()
        assert (await next_change())["state"] == "allocating"
        clock.advance(3)
        service = {"lease": lease["id"], "device": "b1", "identifier": "sim:b1", "kind": "uart",
                   "endpoints": [{"kind": "uart", "host": "127.0.0.1", "port": 4000}]}
        await exporter.beat([board(), board("b1")], [service], [lease["id"]])
        ready = await next_change()
        assert (ready["state"], ready["state_since"]) == ("in_use", "2027-01-15T08:00:03Z"), "a heartbeat's change"
        await api.post(f"/leases/{lease['id']}/renew", json={"ttl_s": 7200})
        assert (await next_change())["expires_at"] == "2027-01-15T10:00:03Z", "a renewal"
        op = (await api.post(f"/leases/{lease['id']}/flash", json={"image": "golden"})).json()
        assert (await next_change())["flashing"] == op["id"], "a flash begins"
        await exporter.beat([board(), board("b1")], [service], operations=[flash_report(op, "failed", "writing", 9)])
        ended = await next_change()
        assert (ended["flashing"], ended["needs_recovery"]) == (None, True), "a flash ends"
        await api.post(f"/leases/{lease['id']}/release")
        assert (await next_change())["state"] == "reclaiming"
        await FakeExporter(client("host-b"), "host-b").beat([board()])
        assert (await next_change())["conflict_hosts"] == ["host-a", "host-b"], "another host's claim"
        clock.advance(60)
        await rules.reap()
        assert {(await next_change())["state"] for _ in range(2)} == {"offline"}, "host-a went silent"
        await api.post("/admin/devices/b0/retire", json={})
        assert (await next_change())["state"] == "retired"
        await stream.aclose()
        await broadcaster.close()


@pytest.mark.usefixtures("database")
async def test_the_stream_sends_the_queue_when_a_ticket_comes_goes_or_moves(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api, bob = client("alice"), client("bob")
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([device("b0")])
        lease = (await api.post("/leases", json={"device": "b0"})).json()
        broadcaster = Broadcaster(rules.devices.list_devices, rules.life.notifier, device_row,
                                  read_queue=lambda: rules.scheduler.queue(), render_entry=queue_row)
        rows, plain = broadcaster.stream(html=True), broadcaster.stream()
        for stream in (rows, plain):
            assert (await anext(stream)).startswith(b"retry: ")
        first = frames(await asyncio.wait_for(anext(rows), WAIT_S))
        assert [event for event, _ in first] == ["snapshot", "queue"] and first[1][1] == [], "the queue, empty"
        assert [event for event, _ in frames(await asyncio.wait_for(anext(plain), WAIT_S))] == ["snapshot", "queue"]

        ticket = (await bob.post("/leases", json={"class": "sim-board", "queue": True})).json()
        event, (entry,) = frame(await asyncio.wait_for(anext(rows), WAIT_S))  # (b0 did not change: the queue alone)
        assert event == "queue" and entry["ticket"] is None, "no ticket ids: every viewer gets the same"
        assert (entry["requester"], entry["position"], entry["kind"]) == ("bob", 1, "interactive")
        assert entry["html"].startswith('<tr data-requester="bob">')
        assert "any device of class sim-board" in entry["html"]
        _, (bare,) = frame(await asyncio.wait_for(anext(plain), WAIT_S))
        assert "html" not in bare and ticket["ticket"] not in json.dumps(bare)

        clock.advance(30)
        await api.post(f"/leases/{lease['id']}/renew", json={"ttl_s": 7200})
        changes = frames(await asyncio.wait_for(anext(rows), WAIT_S))
        assert [event for event, _ in changes] == ["device"], "a ticket waiting longer is no change of the queue"
        await bob.post(f"/tickets/{ticket['ticket']}/cancel")
        assert frame(await asyncio.wait_for(anext(rows), WAIT_S)) == ("queue", [])
        await rows.aclose()
        await plain.aclose()
        await broadcaster.close()


@pytest.mark.usefixtures("database")
async def test_a_step_s_progress_reaches_the_stream_though_it_marks_only_its_operation(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        report = stepped(COOLDOWN, REBOOT)
        await exporter.beat([report])
        lease = (await api.post("/leases", json={"device": "d0"})).json()
        await api.post(f"/leases/{lease['id']}/release")
        await exporter.beat([report])  # its services are gone: the steps begin
        (op,) = await desired_ops(api)
        broadcaster = Broadcaster(rules.devices.list_devices, rules.life.notifier, device_row)
        stream = broadcaster.stream(html=True)
        await anext(stream)
        ((_, (shown,)),) = frames(await asyncio.wait_for(anext(stream), WAIT_S))
        assert shown["reason"] == "step 1/2 cooldown: queued"
        for detail in ("cooling down: 51.2 °C", "cooling down: 48.0 °C"):  # (the second: no change of state)
            await exporter.beat([report], operations=[op_report(op, "running", detail=detail)])
            event, changed = frame(await asyncio.wait_for(anext(stream), WAIT_S))
            assert (event, changed["reason"]) == ("device", f"step 1/2 cooldown: {detail}")
            assert f'<span class="why">step 1/2 cooldown: {detail}</span>' in changed["html"]
        await stream.aclose()
        await broadcaster.close()


async def test_a_broadcaster_made_without_the_queue_follows_it_once_told(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        await FakeExporter(client(), "host-a").beat([device("b0")])
        broadcaster = Broadcaster(rules.devices.list_devices, rules.life.notifier, device_row)  # as app.py makes it
        stream = broadcaster.stream(html=True)
        await anext(stream)
        assert frame(await asyncio.wait_for(anext(stream), WAIT_S))[0] == "snapshot"
        broadcaster.follow_queue(lambda: rules.scheduler.queue(), queue_row)  # what a page does
        assert frame(await asyncio.wait_for(anext(stream), WAIT_S)) == ("queue", [])
        broadcaster.follow_queue(lambda: [], queue_row)  # (told twice: the first stays)
        await client("bob").post("/leases", json={"device": "b0"})
        await client("carol").post("/leases", json={"device": "b0", "queue": True})
        seen = []
        while not any(event == "queue" for event, _ in seen):
            seen += frames(await asyncio.wait_for(anext(stream), WAIT_S))
        assert [e["requester"] for e in seen[-1][1]] == ["carol"]
        await stream.aclose()
        await broadcaster.close()


async def seed(url: str, names: list[str]) -> None:
    """Devices on host-a, reported straight to a coordinator (no exporter: leases stay pending)."""
    async with httpx2.AsyncClient(base_url=f"{url}/api/v1", timeout=10) as api:
        assert (await FakeExporter(api, "host-a").beat([device(n) for n in names])).status_code == 200


@asynccontextmanager
async def event_stream(url: str, html: bool = False):
    """The events of a coordinator's stream, as they come: an async iterator."""
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(10, read=30)) as http:
        async with http.sse(f"{url}/api/v1/events", params={"html": "1"} if html else None) as source:
            assert source.response.status_code == 200, await source.response.aread()
            yield aiter(source)


async def next_event(source, kind: str = "device", timeout: float = WAIT_S):
    async def first():
        async for event in source:
            if event.event == kind:
                return event.json()
    return await asyncio.wait_for(first(), timeout)


async def test_the_event_stream_of_a_coordinator_process(coordinator):
    await seed(coordinator.url, ["b0", "b1"])
    async with event_stream(coordinator.url) as plain, event_stream(coordinator.url, html=True) as rows:
        snapshot = await next_event(plain, "snapshot")
        assert snapshot == httpx2.get(f"{coordinator.url}/api/v1/devices").json()
        assert [d["html"][:18] for d in await next_event(rows, "snapshot")] == ['<tr data-name="b0"',
                                                                                '<tr data-name="b1"']
        assert await next_event(plain, "queue") == [] and await next_event(rows, "queue") == [], \
            "the queue follows the snapshot"
        assert coordinator.api("/leases", "POST", json={"device": "b1"}).status_code == 201
        changed = await next_event(plain)  # pushed: the feed has no poll (how soon: bench/live_feed.py)
        assert (changed["name"], changed["state"], changed["holder"]) == ("b1", "allocating", "alice")
        row = await next_event(rows)
        assert row["html"].startswith('<tr data-name="b1" data-state="allocating" data-holder="alice">')

        queued = coordinator.api("/leases", "POST", json={"device": "b1", "queue": True},
                                 headers={"X-Device-Loop-User": "bob"})
        assert queued.status_code == 201 and queued.json()["state"] == "waiting"
        (entry,) = await next_event(rows, "queue")
        assert (entry["requester"], entry["device"], entry["ticket"]) == ("bob", "b1", None)
        assert [e["requester"] for e in await next_event(plain, "queue")] == ["bob"], "plain subscribers get it too"
    plain_get = httpx2.get(f"{coordinator.url}/api/v1/events", timeout=5)
    assert plain_get.status_code == 406 and plain_get.json()["error"] == "not_acceptable"


async def test_a_change_through_one_process_reaches_a_viewer_of_another(two_coordinators):
    first, second = two_coordinators
    await seed(first.url, ["b0"])
    async with event_stream(second.url) as source:
        await next_event(source, "snapshot")
        assert first.api("/leases", "POST", json={"device": "b0"}).status_code == 201
        changed = await next_event(source)  # pushed (how soon: bench/live_feed.py)
        assert changed["state"] == "allocating"


# ---- device-loop watch ----------------------------------------------------------------------


def test_watch_prints_each_change_until_ctrl_c(tmp_path, env, coordinator, exporter_factory):
    exporter_factory(sim_devices("sim-board-0"))
    wait_state(coordinator, "sim-board-0", "idle")
    watchers = [subprocess.Popen([sys.executable, "-m", "device_loop.cli", "--coordinator", coordinator.url, "watch",
                                  *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for args in (["--json"], [])]
    try:
        for watcher in watchers:
            assert "watching 1 devices" in watcher.stderr.readline()
        run_cli(env, coordinator.url, "reserve", "sim-board-0", "--wait")
        seen = []
        # (released once the watcher saw it in use: the stream tells a device's state as it is
        # when it sends, and a release at once may come before it sent the lease's start)
        while not seen or seen[-1]["to"] != "in_use":
            seen.append(json.loads(watchers[0].stdout.readline()))
        run_cli(env, coordinator.url, "release", "sim-board-0")
        while seen[-1]["to"] != "idle":
            seen.append(json.loads(watchers[0].stdout.readline()))
        assert all(s["device"] == "sim-board-0" for s in seen)
        assert all(a["to"] == b["from"] for a, b in zip(seen, seen[1:])), "each line goes on from the last"
        assert seen[0]["from"] == "idle" and "in_use" in [s["to"] for s in seen]
        assert {s["holder"] for s in seen if s["to"] == "in_use"} == {"alice"}
        first = watchers[1].stdout.readline()
        assert first.split()[1:] == ["sim-board-0", "idle", "->", seen[0]["to"], "alice"]
        for watcher in watchers:
            watcher.send_signal(signal.SIGINT)
            # (a bound, not a goal: under load the CLI may be slow to end)
            assert watcher.wait(30) == 0, "Ctrl-C ends it quietly"
    finally:
        for watcher in watchers:
            if watcher.poll() is None:
                watcher.kill()


def test_watch_in_a_lab_with_tokens_and_without_a_coordinator(tmp_path, env):
    lab = Coordinator(tmp_path, env, extra=())
    try:
        tokens, _ = lab_tokens(env, lab, tmp_path, "alice")
        watcher = subprocess.Popen([sys.executable, "-m", "device_loop.cli", "--coordinator", lab.url, "watch"],
                                   env={**env, "DEVICE_LOOP_TOKEN": tokens["alice"]}, stderr=subprocess.PIPE,
                                   text=True)
        assert "watching 0 devices" in watcher.stderr.readline(), "the board is public: any token will do"
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(10) == 0
    finally:
        lab.stop()
    gone = run_cli(env, lab.url, "watch", check=False)
    assert gone.returncode == 1 and "cannot reach the coordinator" in gone.stderr
