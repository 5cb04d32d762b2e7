"""What the coordinator runs on a leased device for an agent, who has no shell of its own
(docs/architecture.md, "Running a command on a device": an MCP ``exec`` runs from the
coordinator): one command, and the device's fingerprint, each bounded in time and size.

Both go through ``core/device_exec.py`` in a worker thread (it blocks on a socket or a
child process), so no request of the coordinator waits behind them. A board reached through
ssh is logged in to only as the coordinator's own ``--ssh-logins`` says (``ssh_logins.py``):
the user, the key and the pinned host key, never what its exporter reports.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any, Mapping

from device_loop.core.device_exec import ExecError, exec_on_lease

from device_loop.core.answers import ExecAnswer, LeaseAnswer
from device_loop.core.errors import ErrorCode
from .errors import APIError
from .ssh_logins import OPTION, SshLogins

EXEC_MAX_OUTPUT = 64 * 1024  # of stdout and of stderr, as an agent reads them
FINGERPRINT_MAX_OUTPUT = 1 << 20  # a big machine's /proc/cpuinfo is more than 64 KiB
FINGERPRINT_TIMEOUT_S = 20.0  # each of its few exec round trips
EXEC_AT_ONCE = 8  # execs a coordinator process runs at once, each on a thread for up to 120 s
#: How each refusal of ``exec_on_lease`` is answered: the device or its channel is not there
#: to run it (409), the command did not end in time (504), the command itself is refused (422).
_STATUS = {ErrorCode.NO_CHANNEL: 409, ErrorCode.NO_LOGIN: 409, ErrorCode.NO_PROMPT: 409, ErrorCode.UNREACHABLE: 409,
           ErrorCode.SWITCHED_OFF: 409, ErrorCode.TIMEOUT: 504, ErrorCode.TOO_LARGE: 422, ErrorCode.BAD_COMMAND: 422}


def _refusal(exc: ExecError) -> APIError:
    message = exc.message
    if exc.code == ErrorCode.NO_LOGIN:
        message += (f" (the coordinator logs in to a board's sshd only as its own {OPTION} file says: a [devices.NAME] "
                    "or [hosts.NAME] table with user, identity and host_key; see docs/architecture.md, \"Running a "
                    "command on a device\")")
    return APIError(_STATUS.get(exc.code, 409), exc.code, message)


class ExecSlots:
    """The coordinator's exec slots, shared per person (docs/architecture.md, "Shares of one
    lab"): at most ``total`` at once, and one person at most half of them, so another always
    finds a slot one person's many leases cannot take. A slot is taken and counted with no
    await between (one event loop): two calls never both see the last one free."""

    def __init__(self, total: int):
        self.total = total
        self.per_person = max(1, total // 2)
        self.held: Counter[str] = Counter()

    def refusal(self, person: str) -> APIError | None:
        """Why ``person`` may not take a slot now (a 503 naming the share), else None."""
        if self.held[person] >= self.per_person:
            return APIError(503, ErrorCode.BUSY, f"{person} runs {self.held[person]} commands on devices through this "
                                                 f"coordinator already, the most one person may (half of its "
                                                 f"{self.total} exec slots, shared per person): try again when one "
                                                 f"of them ends")
        if sum(self.held.values()) >= self.total:
            return APIError(503, ErrorCode.BUSY, f"this coordinator runs {self.total} commands on devices already: "
                                                 f"try again in a moment")
        return None

    def take(self, person: str) -> None:
        """Take a slot for ``person``, or raise the refusal."""
        refused = self.refusal(person)
        if refused is not None:
            raise refused
        self.held[person] += 1

    def give(self, person: str) -> None:
        self.held[person] -= 1
        if self.held[person] <= 0:
            del self.held[person]


_slots = ExecSlots(EXEC_AT_ONCE)
_per_lease: dict[str, asyncio.Lock] = {}


@contextlib.asynccontextmanager
async def _one_at_a_time(lease: LeaseAnswer, person: str):
    """One exec per lease at a time (two on one console would type into the same shell),
    and a slot of ``_slots`` for ``person``: past them a clear 503, not threads held for minutes."""
    refused = _slots.refusal(person)
    if refused is not None:  # at once, not after waiting for the lease's other exec
        raise refused
    lock = _per_lease.setdefault(lease["id"], asyncio.Lock())
    try:
        async with lock:
            _slots.take(person)
            try:
                yield
            finally:
                _slots.give(person)
    finally:
        if not lock.locked() and _per_lease.get(lease["id"]) is lock:
            del _per_lease[lease["id"]]


async def exec_on(lease: LeaseAnswer, command: str, timeout_s: float, logins: SshLogins, person: str) -> ExecAnswer:
    """``command`` run on the device of ``lease`` (its holder's view of it) for ``person``
    (who asks: their share of the exec slots); over ssh as ``logins`` say."""
    login = logins.login_for(lease["device"], lease["host"])
    try:
        async with _one_at_a_time(lease, person):
            result = await asyncio.to_thread(exec_on_lease, lease, command, timeout_s, max_output=EXEC_MAX_OUTPUT,
                                             ssh=login)
    except ExecError as exc:
        raise _refusal(exc) from None
    return {"stdout": result.stdout, "stderr": result.stderr, "status": result.status, "channel": result.channel,
            "elapsed_s": result.elapsed_s, "truncated": result.truncated}


async def fingerprint(lease: LeaseAnswer, device: Mapping[str, Any], coordinator_version: str,
                      logins: SshLogins, person: str) -> dict[str, Any]:
    """The fingerprint of the device of ``lease`` (``core.ab.fingerprint.gather``), as JSON, for
    ``person`` (as ``exec_on``); ``device`` is its answer, with the image last flashed onto it;
    over ssh as ``logins`` say."""
    from device_loop.core.ab import fingerprint as fingerprints

    login = logins.login_for(lease["device"], lease["host"])

    def run(command: str, timeout_s: float) -> Any:
        return exec_on_lease(lease, command, min(timeout_s, FINGERPRINT_TIMEOUT_S), max_output=FINGERPRINT_MAX_OUTPUT,
                             ssh=login)

    try:
        async with _one_at_a_time(lease, person):
            found = await asyncio.to_thread(fingerprints.gather, run, lease, device, coordinator_version)
    except ExecError as exc:
        raise _refusal(exc) from None
    return found.model_dump(mode="json", by_alias=True)
