"""Jobs from Python (docs/architecture.md, "Jobs and evidence"), through the REST routes
``core/jobs.py`` lists:

    lab = Lab(url)
    job = lab.jobs.submit(JobSpec.model_validate(tomllib.load(f)))   # queued for a worker
    job = lab.jobs.wait(job.id)                                      # once it ended
    print(lab.jobs.evidence(job.id))                                 # the markdown

The worker's side (claim, beat, reserve, report, finish) is here too: ``client/runner.py``
calls it.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

from device_loop.core.jobs import OPEN_JOB_STATES, CellReport, JobSpec, JobState, JobView, RunRecord, Target

from .http import Coordinator, CoordinatorError
from .lab import Lease, Ticket


class Jobs:
    """A lab's jobs, as the caller's token sees them."""

    def __init__(self, api: Coordinator):
        self.api = api

    # --- for whoever submits ----------------------------------------------------------------

    def submit(self, spec: JobSpec, claim: bool = False) -> JobView:
        """Store a job: queued for a ``device-loop worker``, or (``claim``) the caller's to run at once."""
        return JobView.model_validate(self.api.post("/jobs", {"spec": _spec_json(spec), "claim": claim}))

    def get(self, job_id: str, wait_s: float = 0, unless: JobState | None = None) -> JobView:
        """One job; with ``wait_s``, as soon as its state is not ``unless`` (or then)."""
        params: dict = {"wait": wait_s} if wait_s else {}
        if wait_s and unless is not None:
            params["unless"] = str(unless)
        return JobView.model_validate(self.api.get(f"/jobs/{job_id}", **params))

    def list(self, everyone: bool = False) -> list[JobView]:
        """Your jobs, newest first (an admin's ``everyone``: all)."""
        return [JobView.model_validate(job) for job in self.api.get("/jobs", **({"all": "1"} if everyone else {}))]

    def wait(self, job_id: str, timeout: float | None = None) -> JobView:
        """Block until the job ended (done, failed or cancelled); ``CoordinatorError("timeout")``
        after ``timeout`` seconds (it goes on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        job = self.get(job_id)
        while job.state in OPEN_JOB_STATES:
            left = 25.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise CoordinatorError("timeout", f"{job_id} is still {job.state} after {timeout:g}s; "
                                                  f"follow it with: device-loop job show {job_id}")
            job = self.get(job_id, wait_s=min(left, 25.0), unless=job.state)
        return job

    def evidence(self, job_id: str) -> str:
        """The job's evidence markdown, as the coordinator makes it from the stored runs."""
        return _text(self.api, f"/jobs/{job_id}/evidence")

    def cancel(self, job_id: str) -> JobView:
        """Cancel a queued or running job (its worker stops at its next run; its leases are released)."""
        return JobView.model_validate(self.api.post(f"/jobs/{job_id}/cancel"))

    # --- for its worker ---------------------------------------------------------------------

    def claim(self, users: Sequence[str] = (), wait_s: float = 0) -> JobView | None:
        """The oldest queued job of ``users`` (the caller's own by default), now the caller's
        to run; None when none came within ``wait_s``."""
        answer = self.api._request("POST", "/jobs/claim", json={"users": list(users), "wait_s": wait_s},
                                   timeout=(self.api.http.timeout.read or 0.0) + wait_s)
        job = answer.get("job", answer) if isinstance(answer, dict) else None
        return JobView.model_validate(job) if job else None

    def beat(self, job_id: str) -> JobState:
        """Say the worker is alive; the job's state (not ``running``: stop)."""
        answer = self.api.post(f"/jobs/{job_id}/beat")
        return JobState(answer.get("state", JobState.RUNNING))

    def reserve(self, job_id: str, cell: int, target: Target) -> Lease | Ticket:
        """A lease for one cell, or a ticket for it when nothing that matches is free."""
        body = {"cell": cell, **target.model_dump(by_alias=True, exclude_none=True)}
        answer = self.api.post(f"/jobs/{job_id}/reserve", body)
        return Ticket(self.api, answer) if "ticket" in answer else Lease(self.api, answer)

    def report_cell(self, job_id: str, report: CellReport) -> None:
        self.api.post(f"/jobs/{job_id}/cells", report.model_dump(mode="json", by_alias=True))

    def report_run(self, job_id: str, run: RunRecord) -> None:
        self.api.post(f"/jobs/{job_id}/runs", run.model_dump(mode="json"))

    def finish(self, job_id: str, state: JobState, reason: str = "") -> JobView:
        return JobView.model_validate(self.api.post(f"/jobs/{job_id}/finish", {"state": str(state), "reason": reason}))


def _spec_json(spec: JobSpec) -> dict:
    return spec.model_dump(mode="json", by_alias=True)


def _text(api: Coordinator, path: str) -> str:
    """A route that answers text (markdown), not JSON; a refusal is JSON as ever."""
    import httpx2

    try:
        response = api.http.get(f"/api/v1{path}")
    except httpx2.TransportError as exc:
        raise CoordinatorError("unreachable", f"cannot reach the coordinator at {api.url}: {exc}") from None
    if response.status_code >= 400:
        try:
            data = response.json()
        except ValueError:
            data = {}
        raise CoordinatorError(data.get("error", "error"), data.get("message", response.text[:500]),
                               response.status_code)
    return response.text
