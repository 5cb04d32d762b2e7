"""The client library reads a job's runs whole (docs/architecture.md, "Shares of one lab"):
a job's answer holds its first runs and says where ``job_runs`` goes on; ``Jobs.get`` pages
the rest, and ``Jobs.wait`` reads the runs once, when the job ended."""
from __future__ import annotations

from device_loop.client.jobs_api import Jobs


def a_run(seq: int) -> dict:
    return {"cell": 0, "seq": seq, "arm": "run", "started_at": 1000.0 + seq, "ended_at": 1000.5 + seq, "status": 0}


class PagedJob:
    """A coordinator's answers about one job of ``count`` runs, ``page`` at a time."""

    def __init__(self, count: int, page: int, states=("done",)):
        self.count, self.page, self.states, self.asked = count, page, list(states), []

    def _cursor(self, end: int) -> str | None:
        return f"0.0.{end - 1}" if end < self.count else None

    def get(self, path: str, **params):
        self.asked.append((path, params))
        if path.endswith("/runs"):
            start = int(params["after"].rsplit(".", 1)[1]) + 1 if "after" in params else 0
            end = min(self.count, start + min(params["limit"], self.page))
            return {"runs": [a_run(n) for n in range(start, end)], "run_count": self.count, "next": self._cursor(end)}
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        shown = 0 if params.get("runs") == "false" else min(self.count, self.page)
        return {"id": "job-1", "owner": "alice", "kind": "interactive", "state": state, "reason": "",
                "spec": {"target": {"class": "sim-board"}, "run": ["true"], "rounds": 200}, "created_at": 1.0,
                "cells": [], "runs": [a_run(n) for n in range(shown)], "run_count": self.count,
                "runs_next": self._cursor(shown) if shown else None, "coordinator_version": "test"}


def test_get_reads_every_page_of_a_job_s_runs():
    api = PagedJob(count=1234, page=500)
    job = Jobs(api).get("job-1")  # type: ignore[arg-type]
    assert [r.seq for r in job.runs] == list(range(1234))
    assert [p for p, _ in api.asked] == ["/jobs/job-1", "/jobs/job-1/runs", "/jobs/job-1/runs"]


def test_wait_reads_the_runs_once_when_the_job_ended():
    api = PagedJob(count=700, page=500, states=("running", "running", "done"))
    job = Jobs(api).wait("job-1")  # type: ignore[arg-type]
    assert job.state == "done" and len(job.runs) == 700
    whole = [params for path, params in api.asked if path == "/jobs/job-1" and params.get("runs") != "false"]
    assert len(whole) == 1, api.asked
