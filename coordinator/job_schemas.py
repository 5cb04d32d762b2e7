"""What the job calls take (``calls.py``), one model a call, as ``schemas.py`` has them for
the rest: the REST route reads the fields from the path, the query (a GET) or the JSON body
(a POST), the MCP tool takes them as arguments with these descriptions. A job's spec, its
runs and its cells are ``core/ab/jobs.py``'s models, bounded there; unknown fields are refused.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from device_loop.core.answers import MAX_RUNS_PAGE
from device_loop.core.device_exec import MAX_COMMAND_BYTES
from device_loop.core.ab.jobs import MAX_CELLS, MAX_RETRY, MAX_TEXT_CHARS, JobSpec, metric_regex_refusal
from device_loop.core.protocol import MAX_TAGS, Strict, Tag

from .identity import USERNAME
from .schemas import MAX_WAIT_S, LeaseId

MAX_SERVED_USERS = 64  # the people one worker serves
EXEC_MAX_TIMEOUT_S = 120.0  # an exec the coordinator runs for an agent
EXEC_MAX_COMMAND_CHARS = MAX_COMMAND_BYTES  # what exec takes (in bytes: a command of ASCII, this many characters)

#: A worker's label, as it says (its host and process): shown, never trusted.
WorkerLabel = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]
UserName = Annotated[str, StringConstraints(pattern=USERNAME.pattern)]
DeviceName = Annotated[str, StringConstraints(min_length=1, max_length=64)]

JOB_ID = Field(min_length=1, max_length=64,
               description="the job's id, as submit_job answered it ('job-' and 16 hexadecimal digits, e.g. "
                           "'job-3f9a0c2b7d1e4a56'; at most 64 characters)")


class JobId(Strict):
    job_id: str = JOB_ID


#: Where a page of a job's runs begins: after the run ``CELL.ATTEMPT.SEQ`` (``runs_next``).
RUNS_CURSOR = r"^\d{1,6}\.\d{1,6}\.\d{1,9}$"


class JobRunsPage(JobId):
    after: str | None = Field(default=None, max_length=30, pattern=RUNS_CURSOR,
                              description="the cursor a page ended at (runs_next of job_status, next of job_runs), "
                                          "e.g. '0.0.199'; default: from the first run")
    limit: int = Field(default=200, ge=1, le=MAX_RUNS_PAGE, description="runs a page holds (1 to 500, default 200)")


class JobWait(JobId):
    wait_s: float = Field(default=0, alias="wait", ge=0, le=MAX_WAIT_S,
                          description="long-poll, in seconds: answer as soon as the job's state differs from "
                                      "`unless`, else after this long (0 to 60; an MCP tool waits 30 at most; "
                                      "default 0: answer at once; e.g. 25)")
    unless: str | None = Field(default=None, max_length=32,
                               description="with wait_s: the state the caller last saw (queued, running, done, "
                                           "failed, cancelled), e.g. 'running'; the answer comes once the state is "
                                           "another (at most 32 characters; default: the state it has now)")
    runs: bool = Field(default=True, description="include its first runs (at most 500: run_count says how many it "
                                                 "has, runs_next where job_runs goes on); false for the state, cells "
                                                 "and analysis alone, e.g. false for an agent that follows a job "
                                                 "(default true)")


class SubmitJobIn(Strict):
    spec: JobSpec = Field(description="the job: what to run on (target: device, or class and tags), setup, run "
                                      "(a plain job's commands) or ab (an A/B pair: baseline, patch, rounds), "
                                      "metrics, matrix (the pair over device groups) and retry (0 to 5: a cell the "
                                      "lab failed runs again on another device), as in a job file; e.g. "
                                      "{\"target\": {\"class\": \"sim-board\"}, \"ab\": {\"baseline\": "
                                      "[\"run-workload --cost 1.0\"], \"patch\": [\"run-workload --cost 0.95\"], "
                                      "\"rounds\": 10}}")
    claim: bool = Field(default=False, description="become the job's worker at once (device-loop run): it is "
                                                   "running from now on and its worker must beat; default false: "
                                                   "it waits for a device-loop worker that serves its owner")
    worker: WorkerLabel | None = Field(default=None, description="with claim: the worker's label, as the job "
                                                                 "shows it (e.g. 'ci-7:4242'; at most 200 "
                                                                 "characters); default: the caller's name")

    @model_validator(mode="after")
    def _regexes_a_worker_reads(self) -> SubmitJobIn:
        """A metric's regex is read by RE2 (``core.ab.jobs.metric_pattern``), within bounded
        work a byte: refused now, not when a worker runs the job. (Checked here, not in the
        spec: a spec stored before is read as it is.)"""
        for metric in self.spec.metrics:
            refusal = metric_regex_refusal(metric)
            if refusal is not None:
                raise ValueError(refusal)
        return self


class JobFilter(Strict):
    everyone: bool = Field(default=False, alias="all", description="an admin's: every person's jobs, not only the "
                                                                   "caller's")


class ClaimJobIn(Strict):
    users: Annotated[list[UserName], Field(max_length=MAX_SERVED_USERS)] = Field(
        default_factory=list, description=f"whose queued jobs to take (at most {MAX_SERVED_USERS}); default: the "
                                          "caller's own; others' only with an admin's token")
    wait_s: float = Field(default=0, ge=0, le=MAX_WAIT_S,
                          description="long-poll, in seconds: answer as soon as a job is there to take, else after "
                                      "this long with none (0 to 60, default 0)")
    worker: WorkerLabel | None = Field(default=None, description="the worker's label, as the job shows it (e.g. "
                                                                 "'lab-ci-7:4242'); default: the caller's name")


class JobReserveIn(JobId):
    cell: int = Field(default=0, ge=0, lt=MAX_CELLS, description="the cell the lease is for (0 for a plain job or "
                                                                 "an A/B pair; a matrix's from 0)")
    device: str | None = Field(default=None, min_length=1, max_length=64,
                               description="the device's name (or give class and/or tags)")
    device_class: str | None = Field(default=None, alias="class", min_length=1, max_length=64,
                                     description="any free device of this class")
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS,
                            description=f"any free device with every one of these tags (at most {MAX_TAGS})")
    exclude: list[DeviceName] = Field(default_factory=list, max_length=MAX_RETRY,
                                      description=f"a retry's: devices not to take (those its cell's lab failures "
                                                  f"were on; at most {MAX_RETRY}), e.g. ['sim-board-0']; the device "
                                                  "is then picked by name, a free one first")


class FinishJobIn(JobId):
    state: Literal["done", "failed"] = Field(description="how the job ended: done (every run it asked for ran) or "
                                                         "failed")
    reason: Annotated[str, StringConstraints(max_length=MAX_TEXT_CHARS)] = Field(
        default="", description=f"why, in words (at most {MAX_TEXT_CHARS} characters)")


class ExecIn(LeaseId):
    command: str = Field(min_length=1, max_length=EXEC_MAX_COMMAND_CHARS,
                         description=f"the shell command to run on the leased device (1 to {EXEC_MAX_COMMAND_CHARS} "
                                     "characters), e.g. 'uname -a' or 'cat /proc/cpuinfo'")
    timeout_s: float = Field(default=30, gt=0, le=EXEC_MAX_TIMEOUT_S,
                             description=f"seconds the command may take before it is interrupted (more than 0, at "
                                         f"most {EXEC_MAX_TIMEOUT_S:g}; default 30, e.g. 10)")
