"""Each resource's health schedule, on a fake clock (docs/architecture.md, "Health that heals"):
a check every period, re-checks after a change until two results agree, quarantine with
growing probe intervals and re-admission, and the exporter config keys that set it."""
import pytest

from device_loop.core.model import Health
from device_loop.core.vocabulary import HealthKind
from device_loop.exporter.config import ConfigError, load_config
from device_loop.exporter.health_schedule import HealthRules, HealthSchedule
from lab_in_process import FakeClock

pytestmark = pytest.mark.timeout(30)

OK = Health()
FAILED = Health("failed", "link down")
PERMANENT = Health("failed", "AER fatal errors: 3", HealthKind.PERMANENT)
RULES = HealthRules(period_s=10, recheck_s=1.5, quarantine_failures=3, quarantine_window_s=1800,
                    quarantine_ceiling_s=60, good_probes=3)


@pytest.fixture
def clock():
    return FakeClock(1000.0)


@pytest.fixture
def schedule(clock):
    made = HealthSchedule(RULES, clock)
    made.sync(["card"])
    return made


def check(schedule: HealthSchedule, clock: FakeClock, result: Health) -> bool:
    """Go to the resource's next due time, and check it with ``result``."""
    clock.now = max(clock.now, schedule.next_due())
    assert schedule.due() == ["card"]
    return schedule.record("card", result)


def test_a_new_resource_is_due_at_once_and_then_every_period(schedule, clock):
    assert schedule.due() == ["card"]
    assert check(schedule, clock, OK) is False  # (reported ok before its first check too)
    assert schedule.reported("card") == OK
    assert schedule.due() == [] and schedule.next_due() == clock.now + 10
    clock.now += 9.9
    assert schedule.due() == []
    assert check(schedule, clock, OK) is False and clock.now == 1010.0


def test_a_first_check_that_fails_is_reported_at_once(schedule, clock):
    assert check(schedule, clock, FAILED) is True
    assert schedule.reported("card") == FAILED


def test_one_failure_is_not_reported_the_second_in_a_row_is(schedule, clock):
    check(schedule, clock, OK)
    assert check(schedule, clock, FAILED) is False
    assert schedule.reported("card") == OK
    assert schedule.next_due() == clock.now + 1.5, "a re-check within 1-2 s, not a period later"
    assert check(schedule, clock, FAILED) is True
    assert schedule.reported("card") == FAILED and schedule.next_due() == clock.now + 10


def test_a_flapping_card_is_faulty_only_on_its_second_failure_in_a_row(schedule, clock):
    check(schedule, clock, OK)
    for result in (FAILED, OK, FAILED, OK):  # flapping: no two failures in a row
        assert check(schedule, clock, result) is False
        assert schedule.reported("card") == OK
    assert check(schedule, clock, FAILED) is False
    assert check(schedule, clock, FAILED) is True
    assert schedule.reported("card").status == "failed"


def test_ok_again_only_on_the_second_success(schedule, clock):
    check(schedule, clock, FAILED)
    assert check(schedule, clock, OK) is False and schedule.reported("card") == FAILED
    assert check(schedule, clock, OK) is True and schedule.reported("card") == OK


def test_a_new_reason_for_the_same_status_is_reported_at_once(schedule, clock):
    check(schedule, clock, FAILED)
    worse = Health("failed", "link down for 3 s")
    assert check(schedule, clock, worse) is True and schedule.reported("card") == worse


def test_a_fault_that_turns_permanent_is_confirmed_like_any_change(schedule, clock):
    check(schedule, clock, FAILED)
    assert check(schedule, clock, PERMANENT) is False and schedule.reported("card") == FAILED
    assert check(schedule, clock, PERMANENT) is True and schedule.reported("card") == PERMANENT


def test_only_due_resources_are_checked(clock):
    schedule = HealthSchedule(RULES, clock)
    schedule.sync(["a", "b"])
    schedule.record("a", OK)
    clock.now += 5
    schedule.sync(["a", "b", "c"])
    assert sorted(schedule.due()) == ["b", "c"]
    schedule.sync(["a"])  # b and c unplugged: forgotten
    assert schedule.due() == [] and schedule.next_due() == 1010.0


def fail_confirmed(schedule, clock):
    """One more time the reported health turns failed (from ok): two failures in a row."""
    check(schedule, clock, OK)
    if schedule.reported("card").status == "failed":
        check(schedule, clock, OK)
    check(schedule, clock, FAILED)
    check(schedule, clock, FAILED)
    assert schedule.reported("card").status == "failed"


def test_failing_three_times_in_the_window_is_quarantine(schedule, clock):
    fail_confirmed(schedule, clock)
    fail_confirmed(schedule, clock)
    assert schedule.quarantine("card") is None
    fail_confirmed(schedule, clock)
    quarantine = schedule.quarantine("card")
    assert quarantine is not None
    assert (quarantine.failures, quarantine.window_s, quarantine.probe_s, quarantine.good, quarantine.needed) == \
        (3, 1800, 10, 0, 3)
    assert quarantine.reason == "link down" and schedule.reported("card").status == "failed"


def test_failures_older_than_the_window_do_not_count(schedule, clock):
    fail_confirmed(schedule, clock)
    fail_confirmed(schedule, clock)
    clock.now += 1801
    fail_confirmed(schedule, clock)
    assert schedule.quarantine("card") is None


def quarantined(schedule, clock):
    for _ in range(3):
        fail_confirmed(schedule, clock)
    assert schedule.quarantine("card") is not None


def test_a_quarantined_resource_is_probed_at_growing_intervals_up_to_the_ceiling(schedule, clock):
    quarantined(schedule, clock)
    gaps = []
    for _ in range(5):
        before = clock.now
        assert check(schedule, clock, FAILED) is True, "each probe changes what is reported"
        gaps.append(clock.now - before)
    assert gaps == [10, 20, 40, 60, 60], "the period, doubled after each failed probe, up to the ceiling"
    quarantine = schedule.quarantine("card")
    assert quarantine.probes == 5 and quarantine.probe_s == 60 and quarantine.good == 0


def test_three_good_probes_in_a_row_re_admit_it(schedule, clock):
    quarantined(schedule, clock)
    check(schedule, clock, FAILED)  # next probe in 20 s
    assert check(schedule, clock, OK) is True
    assert schedule.quarantine("card").good == 1 and schedule.reported("card").status == "failed"
    assert check(schedule, clock, FAILED) is True and schedule.quarantine("card").good == 0, "in a row"
    for good in (1, 2):
        check(schedule, clock, OK)
        assert schedule.quarantine("card").good == good
    assert check(schedule, clock, OK) is True
    assert schedule.quarantine("card") is None and schedule.reported("card") == OK
    assert schedule.next_due() == clock.now + 10
    fail_confirmed(schedule, clock)  # the count starts afresh once re-admitted
    assert schedule.quarantine("card") is None


def test_a_probe_that_fails_for_good_ends_the_quarantine_for_a_person(schedule, clock):
    quarantined(schedule, clock)
    assert check(schedule, clock, PERMANENT) is True
    assert schedule.quarantine("card") is None and schedule.reported("card") == PERMANENT


def test_permanent_failures_are_never_quarantined(schedule, clock):
    for _ in range(4):
        check(schedule, clock, OK)
        check(schedule, clock, OK)
        check(schedule, clock, PERMANENT)
        check(schedule, clock, PERMANENT)
        assert schedule.reported("card") == PERMANENT
    assert schedule.quarantine("card") is None


# ---- whose failures count: a lease's holder's never, the lab's always -------------------------

def test_three_failures_inside_a_lease_neither_quarantine_it_nor_count_after_it(schedule, clock):
    schedule.held(["card"])  # its holder's image panics the board, three times
    for _ in range(3):
        fail_confirmed(schedule, clock)
    assert schedule.quarantine("card") is None, "no quarantine during the lease"
    check(schedule, clock, OK)
    check(schedule, clock, OK)
    schedule.held([])
    assert schedule.steps_done(["card"]) is False
    fail_confirmed(schedule, clock)  # the lab's own now: counted from nothing
    fail_confirmed(schedule, clock)
    assert schedule.quarantine("card") is None, "the lease's three do not count after it"
    fail_confirmed(schedule, clock)
    assert schedule.quarantine("card") is not None


def test_the_same_failures_with_no_lease_quarantine_it(schedule, clock):
    schedule.held(["card"])
    schedule.held([])  # (a lease that ended without a failure)
    for _ in range(3):
        fail_confirmed(schedule, clock)
    assert schedule.quarantine("card") is not None


def test_a_failure_its_holder_left_is_forgiven_when_the_steps_reset_it(schedule, clock):
    fail_confirmed(schedule, clock)
    fail_confirmed(schedule, clock)  # two of the lab's
    schedule.held(["card"])
    fail_confirmed(schedule, clock)
    schedule.held([])  # the lease ends with the board panicked
    check(schedule, clock, OK)
    check(schedule, clock, OK)  # a step rebooted it
    assert schedule.steps_done(["card"]) is False
    assert schedule.quarantine("card") is None


def test_a_failure_its_holder_left_that_outlives_the_steps_counts_once(schedule, clock):
    fail_confirmed(schedule, clock)
    fail_confirmed(schedule, clock)  # two of the lab's
    schedule.held(["card"])
    fail_confirmed(schedule, clock)
    schedule.held([])
    check(schedule, clock, FAILED)  # still failed while the steps run: not counted yet
    assert schedule.quarantine("card") is None
    assert schedule.steps_done(["card"]) is True, "failed still after the steps: the lab's"
    quarantine = schedule.quarantine("card")
    assert quarantine is not None and quarantine.failures == 3
    assert schedule.next_due() == clock.now + 10, "probed first after a period"
    assert schedule.steps_done(["card"]) is False, "counted once"


# ---- the exporter config's keys ---------------------------------------------------------------

def load(tmp_path, section: str):
    path = tmp_path / "exporter.toml"
    path.write_text(f'[exporter]\nname = "h"\n{section}\n')
    return load_config(path)


def test_the_keys_make_the_rules(tmp_path):
    assert load(tmp_path, "").exporter.health_rules() == HealthRules()
    rules = load(tmp_path, 'health_period = "1m"\nhealth_recheck = 2\nquarantine_failures = 5\n'
                           'quarantine_window = "1h"\nquarantine_ceiling = "10m"\nquarantine_good_probes = 4'
                 ).exporter.health_rules()
    assert rules == HealthRules(period_s=60, recheck_s=2, quarantine_failures=5, quarantine_window_s=3600,
                                quarantine_ceiling_s=600, good_probes=4)


@pytest.mark.parametrize("section, key", [
    ("health_period = 0", "health_period"),
    ("health_period = -1", "health_period"),
    ("health_period = inf", "health_period"),
    ("health_period = nan", "health_period"),
    ('health_period = "forever"', "health_period"),
    ("health_period = 1e9", "health_period"),
    ("health_period = true", "health_period"),
    ("health_recheck = 0.001", "health_recheck"),
    ("health_period = 5\nhealth_recheck = 6", "health_recheck"),
    ("quarantine_failures = 1", "quarantine_failures"),
    ("quarantine_failures = 1000000", "quarantine_failures"),
    ("quarantine_failures = 2.5", "quarantine_failures"),
    ("quarantine_window = 0", "quarantine_window"),
    ('quarantine_window = "30d"', "quarantine_window"),
    ("quarantine_ceiling = 5", "quarantine_ceiling"),
    ("quarantine_ceiling = 1e12", "quarantine_ceiling"),
    ("quarantine_good_probes = 0", "quarantine_good_probes"),
    ("quarantine_good_probes = 101", "quarantine_good_probes"),
    ("health_perod = 5", "health_perod"),
])
def test_hostile_values_are_refused_at_load(tmp_path, section, key):
    with pytest.raises(ConfigError, match=key):
        load(tmp_path, section)


# ---- the reporter checks only what is due -----------------------------------------------------

class Plugins:
    """A plugin set whose one plugin answers each resource's health from ``answers``, and
    records which resources it was asked about."""

    def __init__(self, answers: dict):
        self.answers, self.asked = answers, []

    def call(self, plugin, hook, host, resource):
        assert hook == "devloop_health"
        self.asked.append(resource.identifier)
        return self.answers[resource.identifier]


def test_the_reporter_checks_only_the_resources_due_and_says_when_a_report_changed(clock):
    from device_loop.core.model import Resource
    from device_loop.exporter.report import Reporter

    plugins = Plugins({"a": OK, "b": OK})
    reporter = Reporter(host=None, plugins=plugins, orphans=None, heartbeat_s=30, boot_id="boot")
    reporter.schedule = HealthSchedule(RULES, clock)
    reporter.resources = [Resource("d-a", "uart", "a", plugin="p"), Resource("d-b", "uart", "b", plugin="p")]
    assert reporter.check_health() is False and sorted(plugins.asked) == ["a", "b"]
    plugins.asked.clear()
    clock.now += 5
    assert reporter.check_health() is False and plugins.asked == [], "nothing due: no plugin asked"
    plugins.answers["a"] = FAILED
    clock.now += 5
    assert reporter.check_health() is False and sorted(plugins.asked) == ["a", "b"], "a's first failure: no report"
    plugins.asked.clear()
    clock.now += 1.5
    assert reporter.check_health() is True and plugins.asked == ["a"], "only the re-check is due"
    assert reporter.schedule.reported("a") == FAILED and reporter.schedule.reported("b") == OK


def test_a_health_answer_that_is_no_health_is_a_failure(clock):
    from device_loop.core.model import Resource
    from device_loop.exporter.report import Reporter

    reporter = Reporter(host=None, plugins=Plugins({"a": {"status": "ok"}}), orphans=None, heartbeat_s=30,
                        boot_id="boot")
    reporter.schedule = HealthSchedule(RULES, clock)
    reporter.resources = [Resource("d-a", "uart", "a", plugin="p")]
    reporter.check_health()
    reported = reporter.schedule.reported("a")
    assert reported.status == "failed" and "not a Health" in reported.reason


def test_the_reporter_counts_no_failure_of_a_lease_s_holder_and_one_its_steps_could_not_reset(clock, tmp_path):
    """The reporter tells the schedule whose failures they are (exporter/lease_watch.py): a
    device is held while this exporter runs a service of a lease on it; its steps after the
    lease are over once each has ended as an operation this exporter reports."""
    from device_loop.core.host import HostContext
    from device_loop.core.model import Resource
    from device_loop.core.protocol import OperationReport, ServiceReport
    from device_loop.exporter.config import CommandStep
    from device_loop.exporter.orphans import OrphanWatch
    from device_loop.exporter.report import Reporter

    plugins = Plugins({"a": OK})
    steps = [CommandStep(step="command", command=["true"]), CommandStep(step="command", command=["true"])]
    reporter = Reporter(host=HostContext("h", tmp_path), plugins=plugins, orphans=OrphanWatch(tmp_path),
                        heartbeat_s=30, boot_id="boot", steps_of=lambda device, device_class: steps)
    reporter.schedule = HealthSchedule(RULES, clock)
    reporter.resources = [Resource("d-a", "uart", "a", plugin="p")]
    lease = [ServiceReport(lease="lease-1", device="d-a", identifier="a", kind="uart")]
    reporter.build(lease, set(), set())
    reporter.check_health()  # (its first check)

    def fails_and_recovers(times: int) -> None:
        for _ in range(times):
            for answer in (FAILED, FAILED, OK, OK):
                plugins.answers["a"] = answer
                clock.now = reporter.schedule.next_due()
                reporter.check_health()
                reporter.build(lease, set(), set())

    fails_and_recovers(3)  # three panics inside the lease
    assert reporter.schedule.quarantine("a") is None
    lease = []
    fails_and_recovers(2)  # two of the lab's
    assert reporter.schedule.quarantine("a") is None, "the lease's three do not count after it"

    lease = [ServiceReport(lease="lease-2", device="d-a", identifier="a", kind="uart")]
    reporter.build(lease, set(), set())
    for answer in (FAILED, FAILED):  # the next holder leaves it failed
        plugins.answers["a"] = answer
        clock.now = reporter.schedule.next_due()
        reporter.check_health()
    holder_s = OperationReport(op="op-0", device="d-a", kind="command", state="done", phase="done")
    reporter.build([], set(), set(), operations=[holder_s])
    step = [OperationReport(op=f"op-{n}", device="d-a", kind="command", state="done", phase="done") for n in (1, 2)]
    reporter.build([], set(), set(), operations=[holder_s, step[0]])
    assert reporter.schedule.quarantine("a") is None, "one step of two is over: its failure is still the holder's"
    beat = reporter.build([], set(), set(), operations=step)
    assert reporter.schedule.quarantine("a") is not None, "failed still after its steps: the lab's third"
    assert beat.devices[0].quarantine is not None, "and reported at once"
