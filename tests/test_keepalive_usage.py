"""A keepalive asked for wrong is refused before anything is asked of the lab
(docs/architecture.md, "Leases that live as long as their client"): on the command line a usage
error (exit 2) saying the range; in Python a ``ValueError`` for what is no duration, and a
``KeepAlive`` only for a keepalive lease."""
import threading

import pytest

from device_loop.client.http import Coordinator
from device_loop.client.keepalive import KeepAlive
from device_loop.client.lab import Lab, Lease
from device_loop.core.durations import keepalive_problem

pytestmark = pytest.mark.timeout(30)

NOWHERE = "http://127.0.0.1:9"  # (nothing listens: a usage error must come before any request)


@pytest.mark.parametrize("value, says", [
    ("0s", "duration must be positive"), ("4s", "a keepalive is 5 to 3600 seconds (5s to 1h, e.g. 30s), not 4s"),
    ("3650d", "a keepalive is 5 to 3600 seconds (5s to 1h, e.g. 30s), not 3650d"), ("10y", "not a duration"), ("soon", "not a duration"),
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


class ScriptedLease:
    """A keepalive lease whose keep-alives answer as ``answers`` say, in turn (an exception is
    raised): what ``KeepAlive`` does with each is the rule under test, not the network."""

    def __init__(self, *answers):
        self.id, self.data, self.answers, self.calls = "lease-1", {"keepalive_s": 30.0}, list(answers), 0
        self.api = Coordinator(NOWHERE, "ann")
        self.state = "active"
        self.done = threading.Event()

    def keep_alive(self, timeout=None):
        self.calls += 1
        answer = self.answers.pop(0) if self.answers else "active"
        if not self.answers:
            self.done.set()
        if isinstance(answer, Exception):
            raise answer
        self.state = answer
        return self


def test_a_keep_alive_every_third_of_the_keepalive_the_network_retried_a_refusal_lost_once():
    from device_loop.client.http import CoordinatorError

    told: list[str] = []
    lease = ScriptedLease(CoordinatorError("unreachable", "no route", 0), CoordinatorError("error", "oops", 502),
                          "active", CoordinatorError("lease_ended", "lease-1 is revoked (by admin root)", 409))
    keeper = KeepAlive(lease, told.append)  # type: ignore[arg-type]
    assert keeper.period == 10.0, "a third of the keepalive: two may be lost before it lapses"
    keeper.period = 0.01  # (the rule under test is what each answer does, not the wait between them)
    keeper.start()
    keeper._thread.join(10)
    assert not keeper._thread.is_alive(), "a refusal ends it: never retried"
    assert lease.calls == 4 and told == ["lease-1 could not be kept alive: lease-1 is revoked (by admin root)"]
    assert keeper.lost == told[0]
    keeper.stop()  # (after the end: nothing to wait for, nothing told again)
    assert len(told) == 1


def test_stop_ends_the_thread_and_a_refusal_after_it_is_not_a_loss():
    lease = ScriptedLease(*["active"] * 3)
    keeper = KeepAlive(lease)  # type: ignore[arg-type]
    keeper.period = 0.01
    keeper.start()
    assert lease.done.wait(10)
    keeper.stop()
    assert not keeper._thread.is_alive() and keeper.lost is None


class RecordingApi:
    """A coordinator that records what it is asked and answers each with ``answers``, in turn."""

    def __init__(self, *answers):
        self.asked: list[tuple] = []
        self.answers = list(answers)
        self.timeout = 15.0

    def post(self, path, body=None, key=None, **options):
        self.asked.append(("POST", path, body, options))
        return self.answers.pop(0)

    def get(self, path, **params):
        self.asked.append(("GET", path, params))
        return self.answers.pop(0)


def test_a_keep_alive_is_a_renewal_without_ttl_or_idempotency_key():
    api = RecordingApi({"id": "lease-1", "state": "active", "keepalive_s": 30.0})
    Lease(api, {"id": "lease-1", "keepalive_s": 30.0}).keep_alive(timeout=2)  # type: ignore[arg-type, typeddict-item]
    assert api.asked == [("POST", "/leases/lease-1/renew", {}, {"keyed": False, "timeout": 2})]


def test_a_keepalive_ticket_is_followed_for_a_third_of_its_keepalive_at_most():
    from device_loop.client.lab import Ticket

    waiting = {"ticket": "tk-1", "state": "waiting", "position": 1, "keepalive_s": 6.0, "lease": None}
    claimed = {**waiting, "state": "claimed", "position": None, "lease": {"id": "lease-1", "keepalive_s": 6.0}}
    api = RecordingApi(waiting, claimed)
    lease = Ticket(api, waiting).wait(timeout=60)  # type: ignore[arg-type]
    assert lease.id == "lease-1"
    assert [(method, path, body["wait_s"], options["keyed"]) for method, path, body, options in api.asked] == [
        ("POST", "/tickets/tk-1/claim", 2.0, False)] * 2, api.asked


def test_people_are_told_a_ticket_or_a_lease_lives_only_while_followed():
    from device_loop.cli.output import lease_text, ticket_text

    ticket = {"ticket": "tk-1", "kind": "interactive", "wants": "b0", "state": "waiting", "position": 1, "reason": "",
              "keepalive_s": 30.0, "lease": None}
    assert "it lapses unless followed at least every 30s (keepalive)" in ticket_text(ticket)
    assert "lapses" not in ticket_text({**ticket, "keepalive_s": None})
    lease = {"id": "lease-1", "device": "b0", "state": "active", "expires_at": "2030-01-01T00:00:30Z",
             "keepalive_s": 30.0, "ends_at": "2030-01-03T00:00:00Z", "ready": True, "reason": "ready",
             "endpoints": []}
    assert "kept alive (keepalive 30s), ends 2030-01-03T00:00:00Z at the latest" in lease_text(lease)
