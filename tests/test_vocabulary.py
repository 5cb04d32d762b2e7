"""The vocabulary is written once: the database's CHECK constraints allow exactly the
values of core/vocabulary.py's enums (and core/jobs.py's), and refuse any other (migrations 15, 16
and 17 wrote them)."""
import asyncio
import re
import sqlite3

import pytest

from device_loop.coordinator.store import Store
from device_loop.core.jobs import Arm, JobState
from device_loop.core.vocabulary import DeviceState, HealthStatus, LeaseState, OperationState, TicketKind, TicketState, TokenKind

pytestmark = pytest.mark.timeout(30)

CHECKED = {("devices", "state"): DeviceState, ("devices", "health"): HealthStatus,
           ("leases", "state"): LeaseState, ("operations", "state"): OperationState,
           ("tickets", "state"): TicketState, ("tickets", "kind"): TicketKind, ("tokens", "kind"): TokenKind,
           ("jobs", "state"): JobState, ("jobs", "kind"): TicketKind, ("job_runs", "arm"): Arm}


@pytest.fixture
def schema(tmp_path) -> dict[str, str]:
    """Table -> its CREATE statement, in a database the coordinator made."""
    path = tmp_path / "lab.sqlite"

    async def make():
        store = Store(f"sqlite:///{path}")
        await store.connect()
        await store.disconnect()

    asyncio.run(make())
    with sqlite3.connect(path) as db:
        return dict(db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall())


def test_each_state_column_allows_exactly_its_enum(schema):
    for (table, column), enum in CHECKED.items():
        allowed = set(re.findall(rf"\b{column} = '([A-Za-z_]+)'", schema[table]))
        assert allowed == {member.value for member in enum}, f"{table}.{column}"


def test_a_value_outside_the_vocabulary_is_refused_and_each_inside_it_taken(schema):
    db = sqlite3.connect(":memory:")
    tables = {table for table, _ in CHECKED}
    for table in tables:
        db.execute(schema[table])
    rows = iter(range(1_000_000))

    def insert(table: str, column: str, value: str) -> None:
        needed = [c[1] for c in db.execute(f"PRAGMA table_info({table})") if c[3] or c[5]]  # NOT NULL, or the key
        row = {name: next(iter(CHECKED[(table, name)])).value if (table, name) in CHECKED else f"v{next(rows)}"
               for name in needed}
        row[column] = value
        db.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))

    for (table, column), enum in CHECKED.items():
        for member in enum:
            insert(table, column, member.value)
        with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed"):
            insert(table, column, "bogus")
