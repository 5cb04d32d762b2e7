"""Waiting tickets ended together (docs/architecture.md, "Shares of one lab"): a grant refused
to a token whose budget is spent ends that token's other tickets for the device with it (a
fixed number of statements a ticket, never a recursion a ticket), and a retired device's
tickets none can serve end however many they are. On SQLite and on PostgreSQL."""
import pytest

from device_loop.core.scopes import TokenScope
from lab_in_process import FakeExporter, in_process_lab
from test_budgets import SETTINGS, board, exporter_of, token

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60), pytest.mark.usefixtures("database")]

MANY = 300  # more than one statement ends (200), and more levels than a recursion a ticket survived


async def copies(rules, ticket_id: str, n: int) -> None:
    """``n`` copies of waiting ticket ``ticket_id`` (made as its requester made it: counted)."""
    row = await rules.store.row("SELECT * FROM tickets WHERE id = :id", id=ticket_id)
    for i in range(n):
        await rules.store.insert("tickets", {**row, "id": f"{ticket_id}-{i}", "created_at": row["created_at"] + i})
    await rules.store.run("UPDATE user_counts SET open_tickets = open_tickets + :n WHERE name = :r", n=n,
                          r=row["requester"])


async def waiting(rules, requester: str) -> int:
    row = await rules.store.row("SELECT COUNT(*) AS n FROM tickets WHERE requester = :r AND state = 'waiting'",
                                r=requester)
    return row["n"]


async def open_tickets(rules, requester: str) -> int:
    return (await rules.store.row("SELECT open_tickets FROM user_counts WHERE name = :r", r=requester))["open_tickets"]


async def test_a_spent_tokens_many_tickets_end_together_and_the_next_is_served(tmp_path):
    async with in_process_lab(tmp_path, single_user=False, **SETTINGS) as (client, rules, clock):
        agent = client(token=await token(rules, "bot", TokenScope(budget_s=60)))
        ann, bob = client(token=await token(rules, "ann")), client(token=await token(rules, "bob"))
        exporter = await exporter_of(client, rules)
        await exporter.beat([board("b0"), board("b1")])
        held = (await bob.post("/leases", json={"device": "b0"})).json()
        first = (await agent.post("/leases", json={"class": "sim-board", "ttl_s": 60})).json()  # its whole budget
        assert first["device"] == "b1"
        ticket = (await agent.post("/leases", json={"device": "b0", "queue": True})).json()
        await copies(rules, ticket["ticket"], MANY - 1)
        clock.advance(MANY)
        other = (await ann.post("/leases", json={"device": "b0", "queue": True})).json()

        await bob.post(f"/leases/{held['id']}/release")
        before = rules.store.statements
        assert (await exporter.beat([board("b0"), board("b1")])).status_code == 200  # reclaimed: b0 granted
        spent = rules.store.statements - before
        assert spent <= MANY + 60, f"{spent} statements: an audit entry a ticket ended, and a fixed few besides"
        assert (await ann.post(f"/tickets/{other['ticket']}/claim")).json()["state"] == "claimed", "the next one is served"
        assert await waiting(rules, "bot") == 0 and await open_tickets(rules, "bot") == 0
        ended = (await agent.get(f"/tickets/{ticket['ticket']}-{MANY - 2}")).json()
        assert ended["state"] == "cancelled" and ended["reason"].startswith("budget: 0 of 1 device-minutes"), ended


async def test_every_ticket_none_can_serve_ends_when_the_last_device_is_retired(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        ann, root = client("ann"), client("root")
        await FakeExporter(root, "host-a").beat([board("r0")])
        assert (await root.post("/leases", json={"device": "r0"})).status_code == 201
        ticket = (await ann.post("/leases", json={"class": "sim-board", "queue": True})).json()
        await copies(rules, ticket["ticket"], MANY - 1)

        assert (await root.post("/admin/devices/r0/retire", json={"force": True})).status_code == 200
        assert await waiting(rules, "ann") == 0 and await open_tickets(rules, "ann") == 0
        last = (await ann.get(f"/tickets/{ticket['ticket']}-{MANY - 2}")).json()
        assert last["state"] == "cancelled" and "no device can serve it: r0" in last["reason"], last
