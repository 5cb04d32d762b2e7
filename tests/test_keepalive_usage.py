"""A keepalive asked for wrong is refused before anything is asked of the lab
(docs/architecture.md, "Leases that live as long as their client"): on the command line a usage
error (exit 2) saying the range; in Python a ``ValueError`` for what is no duration, and a
``KeepAlive`` only for a keepalive lease."""
import pytest

from device_loop.client.http import Coordinator
from device_loop.client.keepalive import KeepAlive
from device_loop.client.lab import Lab, Lease
from device_loop.core.durations import keepalive_problem

pytestmark = pytest.mark.timeout(30)

NOWHERE = "http://127.0.0.1:9"  # (nothing listens: a usage error must come before any request)


@pytest.mark.parametrize("value, says", [
    ("0s", "duration must be positive"), ("4s", "a keepalive is 5 to 3600 seconds"),
    ("3650d", "a keepalive is 5 to 3600 seconds"), ("10y", "not a duration"), ("soon", "not a duration"),
    ("30", "give a unit"), ("nan", "not a duration")])
def test_reserve_keepalive_out_of_range_is_a_usage_error(value, says):
    from click.testing import CliRunner

    from device_loop.cli.commands import reserve_command

    done = CliRunner().invoke(reserve_command, ["--coordinator", NOWHERE, "--user", "ann", "sim-board-0",
                                                "--keepalive", value], obj={"coordinator": None, "user": None})
    assert done.exit_code == 2 and says in done.output, done.output


def test_the_range_is_said_one_way_everywhere():
    assert keepalive_problem(30) is None and keepalive_problem(5) is None and keepalive_problem(3600) is None
    for bad in (4.99, 3600.5, float("nan"), float("inf"), True, "30", None):
        assert keepalive_problem(bad).startswith("a keepalive is 5 to 3600 seconds"), bad


def test_a_keepalive_the_client_cannot_read_is_refused_before_a_request():
    with pytest.raises(ValueError, match="not a duration"):
        Lab(NOWHERE, user="ann").reserve("sim-board-0", keepalive="a while")


def test_only_a_keepalive_lease_is_kept_alive():
    plain = Lease(Coordinator(NOWHERE, "ann"), {"id": "lease-1", "keepalive_s": None})  # type: ignore[typeddict-item]
    with pytest.raises(ValueError, match="no keepalive lease"):
        KeepAlive(plain)
