"""``device-loop worker``: a daemon that takes the queued jobs of the people it serves, one
at a time, and runs them on this machine (docs/architecture.md, "Jobs and evidence").

It serves its token's own user unless ``--users`` names others (an admin's token); then it
runs each person's commands under their own Unix account (``--account``,
``client/accounts.py``), never hands them its token, and refuses to start without an
account for each or without cgroups. Each job runs in a cgroup of its own
(``client/job_cgroups.py``); a worker serving only its own user runs without where the
machine has none it may use, and says so. The worker is not readable by its children
(``keep_private``).

SIGTERM or Ctrl-C while a job runs kills that job's running command (all of it), ends the
job ``failed`` ("worker stopped") with the runs it has, releases its leases, and exits;
while it waits for a job it exits at once. A worker killed outright stops beating, and the
coordinator's reaper ends its job ("worker lost"); its commands die with it (its keeper
kills its cgroups).
"""
from __future__ import annotations

import signal
import sys
import time

import click

from device_loop.core.vocabulary import JobState
from device_loop.core.process import keep_private

from device_loop.client.accounts import Account, AccountError, account_map, can_switch_accounts
from .commands import _tags, _ttl, lab_command
from device_loop.client.http import CoordinatorError
from device_loop.client.job_cgroups import CgroupsUnavailable, JobCgroups
from device_loop.client.lab import Lab
from device_loop.client.runner import BEAT_S, Runner, Stopper

MAX_CLAIM_WAIT_S = 60.0   # the coordinator's longest long-poll
RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # after the coordinator could not be reached, in turn


class WorkerStopping(BaseException):
    """A stop signal while no job runs (a BaseException: nothing on the way swallows it)."""


def _log(text: str) -> None:
    click.echo(f"{time.strftime('%H:%M:%S')} {text}", err=True)


class Worker:
    """Claims jobs and runs them until stopped (``--once``: one job, or none)."""

    def __init__(self, lab: Lab, users: list[str], poll_s: float, beat_s: float, cgroups: JobCgroups | None = None,
                 accounts: dict[str, Account] | None = None):
        self.lab, self.users, self.poll_s = lab, users, poll_s
        self.runner = Runner(lab.jobs, beat_s=beat_s, say=_log, share_token=not users, cgroups=cgroups,
                             accounts=accounts)
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
@click.option("--account", "accounts", multiple=True, metavar="USER=ACCOUNT",
              help="the Unix account USER's commands run as (a login name, or UID[:GID]): one for each of --users, "
                   "each their own, never root's or the worker's")
@click.option("--once", is_flag=True, help="run one job (or wait --poll for one) and exit: 0 done, 1 failed")
@click.option("--poll", default="30s", show_default=True, callback=_ttl,
              help="how long one claim waits for a job (at most 60s)")
@click.option("--beat", default=f"{BEAT_S:g}s", show_default=True, callback=_ttl,
              help="how often it tells the coordinator it is alive (under its --job-worker-timeout)")
@lab_command
def worker_command(lab: Lab, users: list[str], accounts: tuple[str, ...], once: bool, poll: float, beat: float,
                   as_json: bool):
    """Run the queued jobs of the people this worker serves, one at a time, on this machine."""
    keep_private()
    served = _accounts(users, accounts)
    cgroups = _cgroups(shared=bool(users))
    worker = Worker(lab, users, poll, beat, cgroups, served)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, worker.on_signal)
    _log(f"worker: serving {', '.join(users) or 'your own'} jobs at {lab.api.url}" +
         "".join(f"; {user}'s as {account.name}" for user, account in (served or {}).items()))
    try:
        code = worker.serve(once)
    except WorkerStopping:
        code = 0
    finally:
        if cgroups is not None:
            cgroups.close()
    _log("worker: stopped")
    sys.exit(code)


def _accounts(users: list[str], given: tuple[str, ...]) -> dict[str, Account] | None:
    """The account of each served person (None: a worker of its own user's jobs), or exit
    saying why the worker will not serve them."""
    if not users:
        if given:
            raise click.UsageError("--account is for a worker that serves others (--users)")
        return None
    try:
        accounts = account_map(users, given)
    except AccountError as exc:
        raise click.UsageError(str(exc)) from None
    if not can_switch_accounts():
        raise click.UsageError("a worker that serves others runs their commands under their own accounts: run it as "
                               "root, or with CAP_SETUID and CAP_SETGID")
    return accounts


def _cgroups(shared: bool) -> JobCgroups | None:
    """This worker's job cgroups; without (a worker of its own user's jobs, where the machine
    has none it may use), None, or exit if it serves others."""
    try:
        return JobCgroups.start(_log)
    except CgroupsUnavailable as exc:
        if shared:
            _log(f"worker: a worker that serves others runs each job in a cgroup of its own, and {exc}; run it as "
                 "root, or in a cgroup delegated to its account (systemd: Delegate=yes)")
            sys.exit(1)
        _log(f"worker: warning: {exc}; each command runs in a process group of its own instead, and a process "
             "that leaves it (setsid) can outlive its job")
        return None
