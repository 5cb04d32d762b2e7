"""What the coordinator runs on a leased device for an agent, who has no shell of its own
(docs/architecture.md, "Running a command on a device": an MCP ``exec`` runs from the
coordinator): one command, and the device's fingerprint, each bounded in time and size.

Both go through ``core/device_exec.py`` in a worker thread (it blocks on a socket or a
child process), so no request of the coordinator waits behind them.
"""
from __future__ import annotations

import asyncio
from typing import Any, Mapping

from device_loop.core.device_exec import ExecError, exec_on_lease

from .answers import ExecAnswer, LeaseAnswer
from .errors import APIError

EXEC_MAX_OUTPUT = 64 * 1024  # of stdout and of stderr, as an agent reads them
FINGERPRINT_TIMEOUT_S = 20.0  # each of its few exec round trips
#: How each refusal of ``exec_on_lease`` is answered: the device or its channel is not there
#: to run it (409), the command did not end in time (504), the command itself is refused (422).
_STATUS = {"no_channel": 409, "no_prompt": 409, "unreachable": 409, "timeout": 504, "too_large": 422,
           "bad_command": 422}


def _refusal(exc: ExecError) -> APIError:
    return APIError(_STATUS.get(exc.code, 409), exc.code, exc.message)


async def exec_on(lease: LeaseAnswer, command: str, timeout_s: float) -> ExecAnswer:
    """``command`` run on the device of ``lease`` (its holder's view of it)."""
    try:
        result = await asyncio.to_thread(exec_on_lease, lease, command, timeout_s, max_output=EXEC_MAX_OUTPUT)
    except ExecError as exc:
        raise _refusal(exc) from None
    return {"stdout": result.stdout, "stderr": result.stderr, "status": result.status, "channel": result.channel,
            "elapsed_s": result.elapsed_s, "truncated": result.truncated}


async def fingerprint(lease: LeaseAnswer, device: Mapping[str, Any], coordinator_version: str) -> dict[str, Any]:
    """The fingerprint of the device of ``lease`` (``core.fingerprint.gather``), as JSON;
    ``device`` is its answer, with the image last flashed onto it."""
    from device_loop.core import fingerprint as fingerprints

    def run(command: str, timeout_s: float) -> Any:
        return exec_on_lease(lease, command, min(timeout_s, FINGERPRINT_TIMEOUT_S), max_output=EXEC_MAX_OUTPUT)

    try:
        found = await asyncio.to_thread(fingerprints.gather, run, lease, device, coordinator_version)
    except ExecError as exc:
        raise _refusal(exc) from None
    return found.model_dump(mode="json", by_alias=True)
