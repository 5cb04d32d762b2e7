"""``device-loop exec`` tells the lab's failure from the command's (docs/architecture.md, "Lab
failures"): a device it cannot reach or that is not ready is exit 75, so that a test harness
calling ``exec`` under ``device-loop with`` or a job is not counted a failed test; a wrong
command stays the caller's (exit 1). No lab: the lease a job's command is given
(``LEASE_ANSWER_ENV``) names a console nothing listens on."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from device_loop.cli.main import cli
from device_loop.core.ports import free_port  # (nothing listens there: the board unreachable)
from device_loop.core.usage import LEASE_ANSWER_ENV
from device_loop.core.vocabulary import LAB_FAILURE_STATUS

NOWHERE = "http://127.0.0.1:9"  # (the lease is given: no request is made)


def lease_answer(**change) -> str:
    return json.dumps({"id": "lease-0123456789abcdef", "device": "sim-board-0", "state": "active", "ready": True,
                       "reason": None,
                       "endpoints": [{"kind": "uart", "role": "console", "protocol": "raw", "host": "127.0.0.1",
                                      "port": free_port()}], **change})


@pytest.mark.parametrize("command, status, said", [
    (["uname"], LAB_FAILURE_STATUS, "cannot reach sim-board-0's console"),
    (["echo", "a\x07b"], 1, "control character"),       # the command's own fault, found before connecting
])
def test_exec_says_whose_failure_it_was(command, status, said):
    done = CliRunner().invoke(cli, ["--coordinator", NOWHERE, "exec", "--json", "sim-board-0", "--", *command],
                              env={LEASE_ANSWER_ENV: lease_answer()})
    assert done.exit_code == status, done.output
    answer = json.loads(done.output.strip().splitlines()[-1])
    assert said in answer["message"], answer
