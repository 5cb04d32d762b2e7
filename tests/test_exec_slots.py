"""The coordinator's exec slots are shared per person (docs/architecture.md, "Shares of one
lab"): one person with many leases never takes them all, another's exec goes through."""
from __future__ import annotations

import asyncio
import threading

import pytest

from conftest import WAIT_S
from device_loop.coordinator import device_commands
from device_loop.coordinator.errors import APIError
from device_loop.coordinator.ssh_logins import SshLogins
from device_loop.core.device_exec import ExecResult

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def _lease(n: int) -> dict:
    return {"id": f"lease-{n}", "device": f"b{n}", "host": "host-a"}


async def until(condition: threading.Condition, holds) -> None:
    """Return once ``holds()`` is true, as the threads that change it notify ``condition``."""
    def wait() -> None:
        with condition:
            assert condition.wait_for(holds, timeout=WAIT_S), f"not within {WAIT_S:g} s"
    await asyncio.to_thread(wait)


async def test_a_person_with_eight_leases_leaves_slots_for_another(monkeypatch):
    release, entered = threading.Event(), threading.Condition()
    started: list[str] = []

    def blocked_exec(lease, command, timeout_s, max_output, ssh):
        with entered:
            started.append(lease["id"])
            entered.notify_all()
        release.wait(20)
        return ExecResult(stdout="ok\n", stderr="", status=0, channel="uart", elapsed_s=0.0, truncated=False)

    monkeypatch.setattr(device_commands, "exec_on_lease", blocked_exec)
    logins, total = SshLogins(), device_commands.EXEC_AT_ONCE
    share = total // 2
    alices = [asyncio.create_task(device_commands.exec_on(_lease(n), "true", 10, logins, "alice"))
              for n in range(total)]
    await until(entered, lambda: len(started) >= share)  # (the others refused on their first step, before)
    refused = [t for t in alices if t.done()]
    assert len(refused) == total - share
    for task in refused:
        with pytest.raises(APIError) as seen:
            task.result()
        assert seen.value.status == 503 and "alice runs 4 commands" in seen.value.message
        assert "shared per person" in seen.value.message
    bob = asyncio.create_task(device_commands.exec_on(_lease(99), "true", 10, logins, "bob"))
    await until(entered, lambda: "lease-99" in started)
    release.set()
    assert (await bob)["stdout"] == "ok\n"
    assert [(await t)["status"] for t in alices if t not in refused] == [0] * share
    assert not device_commands._slots.held  # every slot given back


def test_the_coordinator_full_refuses_everyone():
    slots = device_commands.ExecSlots(4)
    for person in ("alice", "alice", "bob", "bob"):
        slots.take(person)
    refused = slots.refusal("carol")
    assert refused is not None and "runs 4 commands on devices already" in refused.message
    slots.give("bob")
    assert slots.refusal("carol") is None and slots.refusal("alice") is not None
