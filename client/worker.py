"""``device-loop worker``: a daemon that takes the queued jobs of the people it serves, one
at a time, and runs them on this machine (docs/architecture.md, "Jobs and evidence").

It serves its token's own user unless ``--users`` names others (an admin's token). SIGTERM
or Ctrl-C while a job runs kills that job's running command (its whole process group),
ends the job ``failed`` ("worker stopped") with the runs it has, releases its leases, and
exits; while it waits for a job it exits at once. A worker killed outright stops beating,
and the coordinator's reaper ends its job ("worker lost"); its commands die with it
(``client/local_run.py``).
"""
from __future__ import annotations

import signal
import sys
import time

import click

from device_loop.core.jobs import JobState

from .commands import _tags, _ttl, lab_command
from .http import CoordinatorError
from .lab import Lab
from .runner import BEAT_S, Runner, Stopper

MAX_CLAIM_WAIT_S = 60.0   # the coordinator's longest long-poll
RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # after the coordinator could not be reached, in turn


class WorkerStopping(BaseException):
    """A stop signal while no job runs (a BaseException: nothing on the way swallows it)."""


def _log(text: str) -> None:
    click.echo(f"{time.strftime('%H:%M:%S')} {text}", err=True)


class Worker:
    """Claims jobs and runs them until stopped (``--once``: one job, or none)."""

    def __init__(self, lab: Lab, users: list[str], poll_s: float, beat_s: float):
        self.lab, self.users, self.poll_s = lab, users, poll_s
        self.runner = Runner(lab.jobs, beat_s=beat_s, say=_log, share_token=not users)
        self.current: Stopper | None = None
        self.stopping = False

    def on_signal(self, signum, frame) -> None:
        self.stopping = True
        if self.current is not None:
            self.current.stop(f"worker stopped ({signal.Signals(signum).name})")
        else:
            raise WorkerStopping()

    def serve(self, once: bool) -> int:
        """Run jobs as they come: the exit code (``once``: 0 done or none queued, 1 failed)."""
        failures = 0
        while not self.stopping:
            try:
                job = self.lab.jobs.claim(self.users, wait_s=min(self.poll_s, MAX_CLAIM_WAIT_S))
            except CoordinatorError as exc:
                if exc.status:  # a refusal (another's jobs without an admin's token): retrying will not help
                    _log(f"worker: {exc.message}")
                    return 1
                pause = RETRY_S[min(failures, len(RETRY_S) - 1)]
                failures += 1
                _log(f"worker: {exc.message}; trying again in {pause:g}s")
                time.sleep(pause)
                continue
            failures = 0
            if job is None:
                if once:
                    _log("worker: no job queued")
                    return 0
                continue
            _log(f"worker: running {job.id} of {job.owner} ({job.spec.title or 'untitled'})")
            self.current = Stopper()
            try:
                ended = self.runner.run(job, self.current)
            except CoordinatorError as exc:  # the coordinator went away mid-job: its reaper will end it
                _log(f"worker: {job.id}: {exc.message}")
                ended = None
            except Exception as exc:  # a defect of ours, or a job nothing here foresaw: it fails, the worker goes on
                _log(f"worker: {job.id}: unexpected {type(exc).__name__}: {exc}")
                try:
                    ended = self.lab.jobs.finish(job.id, JobState.FAILED, f"the worker could not run it: "
                                                                         f"{type(exc).__name__}: {exc}"[:2000])
                except CoordinatorError:
                    ended = None
            finally:
                self.current = None
            if ended is not None:
                _log(f"worker: {ended.id} {ended.state}" + (f": {ended.reason}" if ended.reason else ""))
            if once:
                return 0 if ended is not None and ended.state is JobState.DONE else 1
        return 0


@click.command("worker")
@click.option("--users", callback=_tags, help="whose queued jobs to run, separated by commas (an admin's token); "
                                              "default: your own")
@click.option("--once", is_flag=True, help="run one job (or wait --poll for one) and exit: 0 done, 1 failed")
@click.option("--poll", default="30s", show_default=True, callback=_ttl,
              help="how long one claim waits for a job (at most 60s)")
@click.option("--beat", default=f"{BEAT_S:g}s", show_default=True, callback=_ttl,
              help="how often it tells the coordinator it is alive (under its --job-worker-timeout)")
@lab_command
def worker_command(lab: Lab, users: list[str], once: bool, poll: float, beat: float, as_json: bool):
    """Run the queued jobs of the people this worker serves, one at a time, on this machine."""
    worker = Worker(lab, users, poll, beat)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, worker.on_signal)
    _log(f"worker: serving {', '.join(users) or 'your own'} jobs at {lab.api.url}")
    try:
        code = worker.serve(once)
    except WorkerStopping:
        code = 0
    _log("worker: stopped")
    sys.exit(code)
