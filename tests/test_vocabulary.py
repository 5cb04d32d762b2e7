"""The vocabulary is written once: the database's CHECK constraints allow exactly the
values of core/vocabulary.py's enums, and refuse any other (migrations 15, 16, 17, 19, 20 and
21 wrote them); every vocabulary the migrations restate (their tuples, the literals of their partial
indexes and updates) is the enum's."""
import asyncio
import re
import sqlite3

import pytest

from device_loop.coordinator import migrations
from device_loop.coordinator.store import Store
from device_loop.core.vocabulary import (LIVE_LEASE_STATES, LIVE_OP_STATES, VOCABULARY, Arm, Band, DeviceState,
                                         FailureKind,
                                         FaultKind,
                                         Fidelity, HealthStatus, JobState, LeaseState, Needs, OperationState,
                                         Purpose, TicketKind, TicketState, TokenKind)

pytestmark = pytest.mark.timeout(30)

CHECKED = {("devices", "state"): DeviceState, ("devices", "health"): HealthStatus,
           ("leases", "state"): LeaseState, ("operations", "state"): OperationState,
           ("tickets", "state"): TicketState, ("tickets", "kind"): TicketKind, ("tokens", "kind"): TokenKind,
           ("jobs", "state"): JobState, ("jobs", "kind"): TicketKind, ("job_runs", "arm"): Arm,
           ("devices", "fault_kind"): FaultKind, ("devices", "fidelity"): Fidelity, ("operations", "purpose"): Purpose,
           ("tickets", "needs"): Needs, ("tickets", "fallback"): Needs, ("job_runs", "failure"): FailureKind,
           ("job_cells", "failure"): FailureKind, ("tokens", "band"): Band, ("tickets", "band"): Band,
           ("jobs", "band"): Band}


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
        allowed = set(re.findall(rf"\b{column} = '([A-Za-z_-]+)'", schema[table]))
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


RESTATED = {"DEVICE_STATES": DeviceState, "HEALTH_STATES": HealthStatus, "LEASE_STATES": LeaseState,
            "OPERATION_STATES": OperationState, "TICKET_STATES": TicketState, "TICKET_KINDS": TicketKind,
            "TOKEN_KINDS": TokenKind, "JOB_STATES": JobState, "RUN_ARMS": Arm, "FAULT_KINDS": FaultKind,
            "FIDELITIES": Fidelity, "PURPOSES": Purpose, "NEEDS": Needs, "FAILURE_KINDS": FailureKind,
            "BANDS": Band}


def test_the_migrations_tuples_are_the_enums():
    """A member added to an enum without a migration that lets the database take it fails here."""
    restated = {name for name, value in vars(migrations).items() if name.isupper() and isinstance(value, tuple)}
    assert restated == set(RESTATED), "a vocabulary the migrations restate, not tied to its enum here"
    for name, enum in RESTATED.items():
        assert getattr(migrations, name) == tuple(member.value for member in enum), name


def _statements() -> list[str]:
    return [text for step in migrations.MIGRATIONS for statement in step
            for text in (statement.values() if isinstance(statement, dict) else [statement])]


def test_the_literals_the_migrations_match_are_the_vocabularys():
    """``state IN ('pending', 'active')`` in a partial index is the live lease states, and
    every value a migration compares a state, health, kind or arm column with is a member."""
    lists = [tuple(re.findall(r"'([^']*)'", found)) for text in _statements()
             for found in re.findall(r"\b(?:state|health|kind|arm) (?:NOT )?IN \(('[^)]*)\)", text)]
    assert lists, "the scan found no literal lists: has the migrations' SQL changed its form?"
    vocabularies = [{member.value for member in enum} for enum in VOCABULARY]
    for values in lists:
        assert any(set(values) <= vocabulary for vocabulary in vocabularies), values
    partial = {tuple(re.findall(r"'([^']*)'", found)) for text in _statements() if "INDEX" in text
               for found in re.findall(r"WHERE (?:exclusive AND )?state IN \(([^)]*)\)", text)}
    assert partial == {tuple(LIVE_LEASE_STATES), tuple(LIVE_OP_STATES)}
