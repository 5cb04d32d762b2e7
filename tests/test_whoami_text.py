"""``device-loop whoami`` in words (docs/architecture.md, "Shares of one lab"): who, the scope,
and a budgeted token's device-minutes left."""
from device_loop.cli.output import whoami_text


def test_whoami_says_the_scope_and_the_budget_left_and_an_unscoped_caller_is_said_so():
    scoped = {"name": "bot", "kind": "agent", "admin": False, "token_id": "tok-1", "band": "background",
              "scope": {"classes": ["rpi4"], "tags": None, "operations": ["exec", "power.cycle"], "max_leases": 2,
                        "max_lease_s": 7200.0, "budget_s": 7200.0, "budget_period": "day"},
              "live_leases": 1,
              "budget": {"budget_s": 7200.0, "period": "day", "held_s": 1800.0, "used_s": 600.0, "left_s": 4800.0,
                         "renews_at": "2027-01-16T00:00:00Z",
                         "words": "budget: 80 of 120 device-minutes left today; it renews at 00:00 UTC"}}
    assert whoami_text(scoped).splitlines() == [
        "bot (agent), band background",
        "scope: class=rpi4 op=exec,power.cycle leases=2 lease=2h",  # the words token create takes
        "leases at once: 1 of 2",
        "budget: 80 of 120 device-minutes left today; it renews at 00:00 UTC (used 10.0, held 30.0 by live leases; "
        "period ends 2027-01-16T00:00:00Z)"]
    alone = {"name": "ann", "kind": "person", "admin": True, "token_id": None, "band": "normal", "scope": None,
             "live_leases": None, "budget": None}
    assert whoami_text(alone).splitlines() == ["ann (person, admin), band normal", "unscoped"]


def test_an_estimate_s_times_are_rounded_to_the_minute_they_fall_in_its_end_for_a_by():
    from device_loop.core.durations import when_granted

    said = when_granted({"likely_at": "2026-12-03T15:14:32Z", "earliest_at": "2026-12-03T15:14:02Z",
                  "latest_at": "2026-12-03T15:20:00Z"})
    assert said == "by 15:15Z (15:14Z to 15:20Z)"  # never "by 15:14Z" for a ticket made at 15:14:32

