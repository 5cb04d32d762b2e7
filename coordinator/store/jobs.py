"""The statements on jobs, their cells, runs and leases, and the open jobs each person holds
(docs/architecture.md, "Jobs and evidence"). Who may use them: ``OWNERS`` and ``LENT_TO``
(docs/architecture.md, "A service reaches only its tables")."""
from __future__ import annotations

from typing import Any

from device_loop.core.vocabulary import OPEN_JOB_STATES, JobState, sql_list

from ..rows import JobCellRow, JobLeaseRow, JobRow, JobRunRow
from .core import Store
from .counts import count_down, count_up

# the coordinator modules whose tables these are, and those handed them besides (in rules.py)
OWNERS = ("jobs.py",)
LENT_TO = ()


_OPEN_JOBS_SQL = sql_list(OPEN_JOB_STATES)


class JobQueries:
    """The statements on jobs, their cells, runs and leases."""

    def __init__(self, db: Store):
        self.db = db

    async def insert_job(self, row: JobRow) -> None:
        await self.db.insert("jobs", row)

    async def job(self, job_id: str, for_update: bool = False) -> JobRow | None:
        return await self.db.row("SELECT * FROM jobs WHERE id = :id" + (self.db.for_update if for_update else ""),
                                 id=job_id)

    async def jobs_of(self, user: str | None, limit: int) -> list[JobRow]:
        """The jobs ``user`` owns or works on (everyone's: None), the open ones first, newest first."""
        where = "" if user is None else "WHERE owner = :u OR worker_user = :u"
        values: dict[str, Any] = {} if user is None else {"u": user}
        return await self.db.rows(f"SELECT * FROM jobs {where} ORDER BY CASE WHEN state IN {_OPEN_JOBS_SQL} THEN 0 "
                                  "ELSE 1 END, created_at DESC, id LIMIT :n", n=limit, **values)

    async def claim_job(self, owners: list[str], worker: str, worker_user: str, now: float) -> JobRow | None:
        """The oldest queued job of one of ``owners`` becomes running, claimed by ``worker_user``;
        None if there is none. On PostgreSQL a job another claim holds is skipped."""
        where, params = self.db.in_list("owner", "owners", owners)
        lock = " FOR UPDATE SKIP LOCKED" if self.db.dialect == "postgresql" else ""
        oldest = await self.db.row(f"SELECT id FROM jobs WHERE state = :q AND {where} ORDER BY created_at, id "
                                   f"LIMIT 1{lock}", q=JobState.QUEUED, **params)
        if oldest is None:
            return None
        return await self.db.row("UPDATE jobs SET state = :r, worker = :w, worker_user = :wu, started_at = :now, "
                                 "beat_at = :now WHERE id = :id AND state = :q RETURNING *", r=JobState.RUNNING,
                                 w=worker, wu=worker_user, now=now, id=oldest["id"], q=JobState.QUEUED)

    async def queued_job_of(self, owners: list[str]) -> bool:
        """Whether a job of one of ``owners`` is queued (a read: it takes nothing)."""
        where, params = self.db.in_list("owner", "owners", owners)
        return await self.db.row(f"SELECT id FROM jobs WHERE state = :q AND {where} LIMIT 1", q=JobState.QUEUED,
                                 **params) is not None

    async def beat_job(self, job_id: str, now: float) -> bool:
        """A running job's worker is alive; False if the job is not running."""
        row = await self.db.row("UPDATE jobs SET beat_at = :now WHERE id = :id AND state = :r RETURNING id",
                                now=now, id=job_id, r=JobState.RUNNING)
        return row is not None

    async def end_job(self, job_id: str, state: JobState, reason: str, now: float,
                      from_states: tuple[JobState, ...]) -> JobRow | None:
        """Move a job in one of ``from_states`` to ``state``: the job as it is now, or None if
        it was in none of them (here or in another process)."""
        marks = sql_list(from_states)
        return await self.db.row(f"UPDATE jobs SET state = :s, reason = :r, ended_at = :now WHERE id = :id AND "
                                 f"state IN {marks} RETURNING *", s=state, r=reason, now=now, id=job_id)

    async def jobs_silent_before(self, before: float, limit: int) -> list[JobRow]:
        """Running jobs whose worker last beat before ``before``, longest silent first."""
        return await self.db.rows("SELECT * FROM jobs WHERE state = :r AND beat_at < :b ORDER BY beat_at, id LIMIT :n",
                                  r=JobState.RUNNING, b=before, n=limit)

    async def job_counts(self) -> dict[str, int]:
        """Jobs in the whole lab, by state."""
        rows = await self.db.rows("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state")
        return {r["state"]: r["n"] for r in rows}

    async def count_job(self, owner: str, limit: int | None) -> bool:
        """Count an open job of ``owner``: False, and nothing counted, at ``limit``."""
        return await count_up(self.db, "open_jobs", owner, 1, limit)

    async def uncount_job(self, owner: str) -> None:
        await count_down(self.db, "open_jobs", owner)

    async def job_lease_count(self, job_id: str) -> int:
        row = await self.db.row("SELECT COUNT(*) AS n FROM job_leases WHERE job = :j", j=job_id)
        return row["n"]

    async def save_job_cell(self, row: JobCellRow) -> None:
        await self.db.insert_many("job_cells", [row], upsert_key="job, cell, attempt")

    async def job_cell(self, job_id: str, cell: int, attempt: int) -> JobCellRow | None:
        return await self.db.row("SELECT * FROM job_cells WHERE job = :j AND cell = :c AND attempt = :a", j=job_id,
                                 c=cell, a=attempt)

    async def job_cells(self, job_id: str) -> list[JobCellRow]:
        return await self.db.rows("SELECT * FROM job_cells WHERE job = :j ORDER BY cell, attempt", j=job_id)

    async def last_run(self, job_id: str, cell: int, attempt: int) -> JobRunRow | None:
        """The last run of an attempt of a cell, if it has one."""
        return await self.db.row("SELECT * FROM job_runs WHERE job = :j AND cell = :c AND attempt = :a "
                                 "ORDER BY seq DESC LIMIT 1", j=job_id, c=cell, a=attempt)

    async def insert_job_run(self, row: JobRunRow) -> bool:
        """Append a run; False, and nothing written, if the job has one of that cell, attempt and seq."""
        columns = list(row)
        inserted = await self.db.row(f"INSERT INTO job_runs ({', '.join(columns)}) VALUES "
                                     f"({', '.join(':' + c for c in columns)}) ON CONFLICT DO NOTHING RETURNING seq",
                                     **row)
        return inserted is not None

    async def job_runs(self, job_id: str) -> list[JobRunRow]:
        return await self.db.rows("SELECT * FROM job_runs WHERE job = :j ORDER BY cell, attempt, seq", j=job_id)

    async def job_runs_page(self, job_id: str, after: tuple[int, int, int] | None, limit: int) -> list[JobRunRow]:
        """At most ``limit`` runs of ``job_id`` in order, after the run ``after`` (cell, attempt, seq)."""
        if after is None:
            return await self.db.rows("SELECT * FROM job_runs WHERE job = :j ORDER BY cell, attempt, seq LIMIT :n",
                                      j=job_id, n=limit)
        return await self.db.rows("SELECT * FROM job_runs WHERE job = :j AND (cell > :c OR (cell = :c AND "
                                  "(attempt > :a OR (attempt = :a AND seq > :s)))) ORDER BY cell, attempt, seq "
                                  "LIMIT :n", j=job_id, c=after[0], a=after[1], s=after[2], n=limit)

    async def job_run_count(self, job_id: str) -> int:
        row = await self.db.row("SELECT COUNT(*) AS n FROM job_runs WHERE job = :j", j=job_id)
        return row["n"]

    async def count_stored_run(self, owner: str, limit: int | None) -> bool:
        """Count a stored run of ``owner``'s: False, and nothing counted, at ``limit``."""
        return await count_up(self.db, "stored_runs", owner, 1, limit)

    async def stored_runs_full(self, owner: str, limit: int | None) -> bool:
        """Whether ``owner`` has ``limit`` runs stored (a read: it takes nothing)."""
        if limit is None:
            return False
        row = await self.db.row("SELECT stored_runs FROM user_counts WHERE name = :n", n=owner)
        return row is not None and row["stored_runs"] >= limit

    async def delete_job(self, job_id: str, owner: str) -> int:
        """Delete an ended job with its cells, runs and the record of its tickets and leases (those
        keep their own rows), its runs no longer counted as ``owner``'s; how many runs it had."""
        runs = await self.job_run_count(job_id)
        for table in ("job_runs", "job_cells", "job_leases"):
            await self.db.run(f"DELETE FROM {table} WHERE job = :j", j=job_id)
        await self.db.run("DELETE FROM jobs WHERE id = :j", j=job_id)
        await count_down(self.db, "stored_runs", owner, runs)
        return runs

    async def add_job_lease(self, job_id: str, cell: int, ticket_id: str | None, lease_id: str | None,
                            now: float) -> None:
        await self.db.insert("job_leases", {"job": job_id, "cell": cell, "ticket_id": ticket_id, "lease_id": lease_id,
                                            "created_at": now})

    async def job_leases(self, job_id: str) -> list[JobLeaseRow]:
        """The tickets and leases ``job_id`` made, in order, with where each stands and the host
        of its device (ending them takes those hosts' locks first)."""
        return await self.db.rows(
            "SELECT jl.cell, jl.ticket_id, t.state AS ticket_state, l.id AS lease_id, l.state AS lease_state, "
            "COALESCE(l.device, t.device) AS device, d.host AS host FROM job_leases jl "
            "LEFT JOIN tickets t ON t.id = jl.ticket_id "
            "LEFT JOIN leases l ON l.id = COALESCE(jl.lease_id, t.lease_id) "
            "LEFT JOIN devices d ON d.name = COALESCE(l.device, t.granted_device, t.device) "
            "WHERE jl.job = :j ORDER BY jl.id", j=job_id)
