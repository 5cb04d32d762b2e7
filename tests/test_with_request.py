"""``device-loop with``'s request and outcome without a lab (docs/architecture.md, "A lease
bound to a command"): a wrong request is a usage error before anything is reserved, and the
exit status follows from how the command ended."""
from __future__ import annotations

import json

import click
import pytest

from device_loop.cli.main import cli
from device_loop.client.command_lease import MAX_ARGUMENTS, CommandRequest, WrongRequest, check_request, runs_image
from device_loop.client.http import CoordinatorError
from device_loop.client.lab_trouble import lab_trouble, lost_reason, wrong_request
from device_loop.core.command_outcome import CommandOutcome, command_status_outcome
from device_loop.core.errors import ErrorCode
from device_loop.core.vocabulary import FailureKind


def request(*command: str, **given) -> CommandRequest:
    given.setdefault("device", "sim-board-0")
    return CommandRequest(command=command, **given)


@pytest.mark.parametrize("given, said", [
    (request(), "give the command"),
    (request(*["true"] * 100_000), "100,000 arguments"),
    (request("true", "x" * (1 << 20)), "bytes; at most"),
    (request("true", "a\0b"), "NUL"),
    (request("true", device=None), "name a DEVICE"),
    (request("true", class_="sim-board"), "not both"),
    (request("true", keepalive_s=1), "--keepalive: a keepalive is 5 to 3600 seconds"),
    (request("true", keepalive_s=10 * 365 * 86400), "--keepalive: a keepalive is 5 to 3600 seconds"),
    (request("true", timeout_s=10 * 365 * 86400), "--timeout"),
    (request("true", max_time_s=10 * 365 * 86400), "--max-time"),
    (request("no-such-program-here"), "no such program"),
])
def test_a_wrong_request_is_refused_before_anything_is_reserved(given, said):
    with pytest.raises(WrongRequest, match=said):
        check_request(given)


def test_a_request_at_the_bounds_is_taken():
    check_request(request(*["true"] * MAX_ARGUMENTS, keepalive_s=5))
    check_request(request("true", device=None, class_="sim-board", tags=("rvv",), keepalive_s=3600))


@pytest.mark.parametrize("args, said", [
    (["with", "sim-board-0", "--keepalive", "0", "--", "true"], "give a unit"),
    (["with", "sim-board-0", "--keepalive", "10y", "--", "true"], "not a duration"),
    (["with", "sim-board-0", "--timeout", "0s", "--", "true"], "positive"),
])
def test_the_command_line_refuses_a_wrong_duration_as_a_usage_error(args, said):
    with pytest.raises(click.UsageError, match=said):
        cli.main(["--coordinator", "http://127.0.0.1:9", *args], standalone_mode=False)


def test_everything_after_the_dashes_is_the_command_untouched():
    context = cli.make_context("device-loop", ["with", "d", "--", "x"], resilient_parsing=True)
    command = cli.get_command(context, "with")
    sub = command.make_context("with", ["d", "--json", "--", "sh", "--json", "-c", "--"], parent=context)
    assert sub.params["device"] == "d" and sub.params["as_json"]
    assert sub.meta["with.command"] == ("sh", "--json", "-c", "--")


@pytest.mark.parametrize("command_status, status, failure", [
    (0, 0, None), (3, 3, FailureKind.TEST), (75, 75, FailureKind.LAB), (-9, 137, FailureKind.TEST),
])
def test_a_command_that_ran_to_its_end_gives_its_own_status(command_status, status, failure):
    assert command_status_outcome(command_status) == (status, failure)


def test_the_outcome_is_one_json_object():
    outcome = CommandOutcome(command=("true",), status=75, failure=FailureKind.LAB, reason="the lease was lost")
    said = json.loads(json.dumps(outcome.to_json()))
    assert (said["status"], said["failure"], said["command"], said["timings"]["total_s"]) == (75, "lab", ["true"], 0)
    assert outcome.lab_failed


LEASE = {"id": "lease-1", "device": "d", "state": "active", "device_state": "in_use", "ready": True,
         "reason": "ready", "switched_off": None}


@pytest.mark.parametrize("change, lost, after_failure", [
    ({}, False, False),
    ({"state": "revoked", "reason": "revoked by bob"}, True, True),
    ({"device_state": "offline"}, True, True),
    ({"device_state": "faulty"}, True, True),
    ({"switched_off": "switched off by alice"}, False, True),   # (its holder may switch it off on purpose)
    ({"ready": False, "reason": "the exporter lost its connection"}, False, True),
])
def test_what_the_lab_failed(change, lost, after_failure):
    lease = {**LEASE, **change}
    assert (lost_reason(lease, lambda name: {"reason": "its host is silent"}) is not None) == lost
    assert (lab_trouble(lease, lambda name: {}) is not None) == after_failure


def flash(state: str, sha256: str = "a" * 64, verified: bool = True) -> dict:
    """A flash as the coordinator answers it: ``verified`` is its reading of the result (a
    result that says verified is not enough: the flash below says so and is not)."""
    return {"kind": "flash", "state": state, "image": {"name": "build-1", "sha256": sha256},
            "result": {"verified": True, "sha256": sha256}, "verified": verified and state == "done"}


@pytest.mark.parametrize("flashes, runs", [
    ([flash("done")], True),
    ([flash("running", "b" * 64), flash("done")], True),    # (one under way changes nothing yet)
    ([flash("failed"), flash("done")], False),               # the last one to end failed: who knows what is there
    ([flash("done", "b" * 64), flash("done")], False),       # another image since
    ([flash("done", verified=False)], False),                 # written, never read back (fastboot)
    ([], False),
])
def test_a_device_runs_an_image_only_by_its_last_flash_read_back(flashes, runs):
    assert runs_image(flashes, "a" * 64) is runs


def test_a_queued_wait_says_the_ticket_s_place_each_time_it_changes_and_only_then():
    """`reserve --queue --wait` and `with --queue` say where their ticket stands the same way
    (client/lab.py telling_place), once a change."""
    from device_loop.client.lab import Ticket, telling_place

    said: list[str] = []
    tell = telling_place(said.append)
    estimate = {"likely_at": "2026-12-08T14:04:10Z", "earliest_at": "2026-12-08T14:02:50Z",
                "latest_at": "2026-12-08T14:30:01Z", "basis": "..."}
    for state, position in (("waiting", 2), ("waiting", 2), ("waiting", 1), ("granted", None), ("granted", None)):
        tell(Ticket(None, {"ticket": "tk-1", "state": state, "position": position, "kind": "interactive",  # type: ignore[arg-type]
                           "wants": "of class sim-board", "estimate": estimate if state == "waiting" else None}))
    assert said == ["tk-1: position 2 (interactive, for a device of class sim-board); likely granted by 14:05Z "
                    "(14:02Z to 14:31Z)",
                    "tk-1: position 1 (interactive, for a device of class sim-board); likely granted by 14:05Z "
                    "(14:02Z to 14:31Z)",
                    "tk-1: granted (interactive, for a device of class sim-board)"]


@pytest.mark.parametrize("code, status, wrong", [
    (ErrorCode.WRONG_FIDELITY, 409, True),      # a device by name that its --needs does not take
    (ErrorCode.NO_SUCH_DEVICES, 409, True),     # a class none has
    (ErrorCode.UNKNOWN_IMAGE, 404, True),
    (ErrorCode.BUSY, 409, False),               # the lab could not give it now: 75, a rerun may pass
    (ErrorCode.ALREADY_YOURS, 409, False),      # a board the same token holds (two CI jobs): it ends
    (ErrorCode.NONE_FREE, 409, False),
])
def test_a_refusal_is_the_request_s_or_the_lab_s(code, status, wrong):
    """``with`` exits 2 on a refusal no wait cures, 75 on one the lab may cure; a job's cell
    refused so fails as its spec's, not the lab's (docs/architecture.md, "Lab failures")."""
    assert wrong_request(CoordinatorError(code, "said", status=status)) is wrong


@pytest.mark.service
def test_with_starts_its_command_without_loading_pydantic_or_the_analysis():
    """``with`` is a CI step's wrapper: its own start is most of its cost (bench/with_overhead.py),
    so what it loads before the command runs stays light (the answers' types only for the type checker)."""
    import subprocess
    import sys

    probe = ("import json, sys; import device_loop.cli.main, device_loop.cli.with_command, "
             "device_loop.client.command_lease; print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                                       check=True).stdout)
    heavy = [name for name in loaded if name.startswith(("pydantic", "scipy", "numpy", "device_loop.core.answers",
                                                         "device_loop.core.ab"))]
    assert heavy == [], heavy[:8]
