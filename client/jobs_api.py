"""Jobs from Python (docs/architecture.md, "Jobs and evidence"), through the REST routes
``core/ab/jobs.py`` lists:

    lab = Lab(url)
    job = lab.jobs.submit(JobSpec.model_validate(tomllib.load(f)))   # queued for a worker
    job = lab.jobs.wait(job.id)                                      # once it ended
    print(lab.jobs.evidence(job.id))                                 # the markdown

The worker's side (claim, beat, reserve, report, finish) is here too: ``client/runner.py``
calls it.
"""
from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from device_loop.core import API_PREFIX
from device_loop.core.answers import MAX_RUNS_PAGE
from device_loop.core.ab.jobs import CellReport, JobSpec, JobSummary, JobView, RunRecord, Target
from device_loop.core.vocabulary import OPEN_JOB_STATES, JobState
from device_loop.core.errors import ErrorCode

from .http import Coordinator, CoordinatorError
from .lab import Lease, Ticket


def worker_label() -> str:
    """How a worker names itself to the lab: its host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"[:200]


def view(answer: Mapping[str, Any]) -> JobView:
    """A job as the coordinator answers it, as the analysis and the evidence read it (what
    the coordinator adds, its reservations and analysis, left out)."""
    return JobView.model_validate({k: answer[k] for k in JobView.model_fields if k in answer})


class Jobs:
    """A lab's jobs, as the caller's token sees them."""

    def __init__(self, api: Coordinator):
        self.api = api

    def apart(self) -> Jobs:
        """The same lab and identity on a ``Coordinator`` of its own, for a thread that ends
        (a job's beat, a matrix cell): closed with it, its connection goes too, where a shared
        ``Coordinator`` would keep every ended thread's connection until it is closed (a
        worker runs job after job)."""
        token = self.api.headers.get("Authorization", "").removeprefix("Bearer ") or None
        return Jobs(Coordinator(self.api.url, self.api.user, timeout=self.api.timeout, retries=self.api.retries,
                                token=token))

    # --- for whoever submits ----------------------------------------------------------------

    def submit(self, spec: JobSpec, claim: bool = False) -> JobView:
        """Store a job: queued for a ``device-loop worker``, or (``claim``) the caller's to run at once."""
        body: dict[str, Any] = {"spec": _spec_json(spec), "claim": claim}
        if claim:
            body["worker"] = worker_label()
        return view(self.api.post("/jobs", body))

    def get(self, job_id: str, wait_s: float = 0, unless: JobState | None = None, runs: bool = True) -> JobView:
        """One job with all its runs (read in pages past the first: ``runs_page``), or
        (``runs`` false) without any; with ``wait_s``, as soon as its state is not ``unless``
        (or then)."""
        params: dict = {"wait": wait_s} if wait_s else {}
        if wait_s and unless is not None:
            params["unless"] = str(unless)
        if not runs:
            params["runs"] = "false"
        answer = self.api.get(f"/jobs/{job_id}", **params)
        after = answer.get("runs_next")
        while after:
            page = self.runs_page(job_id, after)
            answer["runs"] += page["runs"]
            after = page["next"]
        return view(answer)

    def runs_page(self, job_id: str, after: str | None = None, limit: int = MAX_RUNS_PAGE) -> dict[str, Any]:
        """A page of the job's runs after the cursor ``after`` (a ``JobRunsAnswer``)."""
        return self.api.get(f"/jobs/{job_id}/runs", limit=limit, **({"after": after} if after else {}))

    def delete(self, job_id: str) -> dict[str, Any]:
        """Delete an ended job with its runs, for good: they no longer count against your stored runs."""
        return self.api.post(f"/jobs/{job_id}/delete")

    def list(self, everyone: bool = False) -> list[JobSummary]:
        """Your jobs, open ones first (an admin's ``everyone``: all)."""
        return [JobSummary.of(job) for job in self.api.get("/jobs", **({"all": "true"} if everyone else {}))]

    def wait(self, job_id: str, timeout: float | None = None) -> JobView:
        """Block until the job ended (done, failed or cancelled); ``CoordinatorError("timeout")``
        after ``timeout`` seconds (it goes on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        job = self.get(job_id, runs=False)  # (its runs are read once, when it ended)
        while job.state in OPEN_JOB_STATES:
            left = 25.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise CoordinatorError(ErrorCode.TIMEOUT, f"{job_id} is still {job.state} after {timeout:g}s; "
                                                          f"follow it with: device-loop job show {job_id}")
            job = self.get(job_id, wait_s=min(left, 25.0), unless=job.state, runs=False)
        return self.get(job_id)

    def evidence(self, job_id: str) -> str:
        """The job's evidence markdown, as the coordinator makes it from the stored runs."""
        return _text(self.api, f"/jobs/{job_id}/evidence")

    def cancel(self, job_id: str) -> JobView:
        """Cancel a queued or running job (its worker stops at its next run; its leases are released)."""
        return view(self.api.post(f"/jobs/{job_id}/cancel"))

    # --- for its worker ---------------------------------------------------------------------

    def claim(self, users: Sequence[str] = (), wait_s: float = 0) -> JobView | None:
        """The oldest queued job of ``users`` (the caller's own by default), now the caller's
        to run; None when none came within ``wait_s``."""
        body = json.dumps({"users": list(users), "wait_s": wait_s, "worker": worker_label()}).encode()
        # (Coordinator.post's own timeout is shorter than a long-poll; the same key on every retry)
        answer = self.api._request("POST", "/jobs/claim", body=body, timeout=self.api.timeout + wait_s,
                                   headers={"Idempotency-Key": uuid.uuid4().hex, "Content-Type": "application/json"})
        return view(answer["job"]) if answer.get("job") else None

    def beat(self, job_id: str) -> JobState:
        """Say the worker is alive; the job's state (not ``running``: stop)."""
        answer = self.api.post(f"/jobs/{job_id}/beat")
        return JobState(answer.get("state", JobState.RUNNING))

    def reserve(self, job_id: str, cell: int, target: Target, exclude: Sequence[str] = ()) -> Lease | Ticket:
        """A lease for one cell, or a ticket for it when nothing that matches is free; a retry
        leaves out the devices of ``exclude``."""
        body = {"cell": cell, **target.model_dump(by_alias=True, exclude_none=True)}
        if exclude:
            body["exclude"] = list(exclude)
        answer = self.api.post(f"/jobs/{job_id}/reserve", body)
        return Ticket(self.api, answer) if "ticket" in answer else Lease(self.api, answer)

    def report_cell(self, job_id: str, report: CellReport) -> None:
        self.api.post(f"/jobs/{job_id}/cells", report.model_dump(mode="json", by_alias=True))

    def report_run(self, job_id: str, run: RunRecord) -> None:
        self.api.post(f"/jobs/{job_id}/runs", run.model_dump(mode="json"))

    def finish(self, job_id: str, state: JobState, reason: str = "") -> JobView:
        return view(self.api.post(f"/jobs/{job_id}/finish", {"state": str(state), "reason": reason}))


def _spec_json(spec: JobSpec) -> dict:
    return spec.model_dump(mode="json", by_alias=True)


def _text(api: Coordinator, path: str) -> str:
    """A route that answers text (markdown), not JSON; a refusal is JSON as ever."""
    import httpx2

    try:
        response = api.http.get(f"{API_PREFIX}{path}")
    except httpx2.TransportError as exc:
        raise CoordinatorError(ErrorCode.UNREACHABLE, f"cannot reach the coordinator at {api.url}: {exc}") from None
    if response.status_code >= 400:
        try:
            data = response.json()
        except ValueError:
            data = {}
        raise CoordinatorError(data.get("error", "error"), data.get("message", response.text[:500]),
                               response.status_code)
    return response.text
