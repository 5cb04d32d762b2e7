"""A metric's regex costs a worker bounded work (docs/architecture.md, "Jobs and evidence"):
RE2 reads the output in one pass, but at each byte works for each place of the regex that
can be matching there. A regex that could keep too many matching at once is refused
(``core/ab/jobs.py`` ``metric_pattern``: by the coordinator when the job is submitted,
tests/test_hostile_jobs.py, and by the worker for a spec stored before), and the worker cuts
a search past the CPU it gives a metric's regex, saying so (``client/local_run.py``)."""
import random
import time

import pytest

from device_loop.client.local_run import LocalResult, read_metrics
from device_loop.core.ab import regex_cost
from device_loop.core.ab.jobs import (MAX_METRIC_AT_ONCE, METRIC_CPU_S_PER_MIB, CostlyRegex, MetricSpec,
                                      metric_pattern, metric_regex_refusal)

pytestmark = pytest.mark.timeout(60)

MIB = 1 << 20
#: What a hostile probe measured: 26.6 s over 64 KiB of output, 16.8 s over 64 KiB, 8.6 s over 1 MiB.
HOSTILE = ["(?P<value>(.*a){1000})", "((.*a){100}){10}(?P<value>[0-9]+)", "(?P<value>(.*a){20})"]
#: A log line of each kind, as benchmarks print them.
LINES = [
    "time: {:.2f} ms",
    "{:.0f} ops/s",
    "[2024-05-01T12:00:07.{:.0f}Z] <info> bench-decode-h264 frame #{:.0f}/9000 took: {:.3f} ms (p50)",
    "Benchmark random_read: throughput (MiB/s) = {:.1f} MiB/s (avg)",
    "[  5]   0.00-10.00  sec  1.10 GBytes   {:.0f} Mbits/sec                  receiver",
    "INFO decoder[av1]: frame {:.0f} in {:.3f} msec",
    "Elapsed (wall clock) time (h:mm:ss or m:ss): 0:{:.2f}",
]
#: Regexes people write (two of 100 to 500 characters, with alternatives and groups), and the
#: last value each finds in ``output()``.
ORDINARY = {
    r"time: (?P<value>[0-9.]+) ms": 12.5,
    r"(?P<value>\d+) ops/s": 4321,
    r"(?m)^(?:\[[0-9:. ]+\]\s+)?(?:INFO|DEBUG|NOTICE)\s+(?:decoder|encoder)\[(?:h264|h265|vp9|av1)\]:\s+frame\s+\d+\s+"
    r"(?:took|in)\s+(?P<value>[0-9]+(?:\.[0-9]+)?)\s*(?:ms|msec)": 3.25,
    r"(?:\[(?:\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?Z?)\]\s+)?(?:<(?:info|debug|notice|warn)>\s+)?"
    r"(?:(?:bench(?:mark)?|perf|test)[-_ ](?:decode|encode|transcode|scale|blend|composite|upload|download)[-_ ]"
    r"(?:h264|hevc|vp8|vp9|av1|jpeg|png)\s+)?(?:frame|field|slice|tile)\s+#?(?:\d+)(?:/\d+)?\s+"
    r"(?:completed|done|finished|took|in)\s*[:=]?\s*(?P<value>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*"
    r"(?:ms|msec|milliseconds)\b(?:\s+\((?:avg|mean|median|p50|p90|p95|p99|max|min)\))?": 7.125,
    r"(?:(?:Benchmark|Test|Case)\s+(?:sequential_read|sequential_write|random_read|random_write|mixed_rw_70_30|"
    r"fsync_heavy|metadata_ops)\s*[:=]\s*)?(?:throughput|bandwidth|rate)\s*(?:\((?:MB|MiB|GB|GiB)/s\))?\s*[:=]\s*"
    r"(?P<value>[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*(?:MB/s|MiB/s|GB/s|GiB/s)?\s*"
    r"(?:\((?:avg|mean|median|p50|p90|p99)\))?": 812.5,
    r"\[\s*\d+\]\s+0\.00-10\.0\d\s+sec\s+[\d.]+\s+\w?Bytes\s+(?P<value>[\d.]+)\s+\w?bits/sec.*receiver": 941,
    r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:\d+:)?\d+:(?P<value>[\d.]+)": 3.5,
    r"={40}\s*result: (?P<value>\d+)": 17,
}


def output() -> str:
    """A MiB of a benchmark's output, the values above last."""
    draw = random.Random(7)
    lines: list[str] = []
    size = 0
    while size < MIB:
        template = draw.choice(LINES)
        line = template.format(*(draw.uniform(1, 999) for _ in range(template.count("{"))))
        lines.append(line)
        size += len(line) + 1
    lines += ["time: 12.50 ms", "4321 ops/s", "INFO decoder[av1]: frame 8 in 3.250 msec",
              "[2024-05-01T12:00:07.5Z] <info> bench-decode-h264 frame #9/9000 took: 7.125 ms (p50)",
              "Benchmark random_read: throughput (MiB/s) = 812.5 MiB/s (avg)",
              "[  5]   0.00-10.00  sec  1.10 GBytes   941 Mbits/sec                  receiver",
              "Elapsed (wall clock) time (h:mm:ss or m:ss): 0:3.5", "=" * 40, "result: 17"]
    return ("\n".join(lines) + "\n")[-MIB:]


def ran(stdout: str) -> LocalResult:
    return LocalResult(status=0, stdout=stdout, stderr="", started_at=1.0, ended_at=2.0)


@pytest.mark.parametrize("regex", HOSTILE)
def test_a_regex_that_keeps_too_many_places_matching_is_refused(regex):
    with pytest.raises(CostlyRegex):
        metric_pattern(regex)
    said = metric_regex_refusal(MetricSpec(name="decode_ms", regex=regex))
    assert said is not None and said.startswith("metric decode_ms: a worker reads its regex with RE2, which would "
                                                "work too hard at it: "), said


def test_places_matching_at_once():
    assert regex_cost.at_once("(?P<value>(.*a){20})", MAX_METRIC_AT_ONCE) == 40  # all of them, over a run of a's
    assert regex_cost.at_once("(?P<value>(.*a){6})", MAX_METRIC_AT_ONCE) == 12
    # RE2's DFA has 2^15 states: it builds one at each byte of random a's and b's
    assert regex_cost.at_once("(?P<value>[ab]*a[ab]{14})", MAX_METRIC_AT_ONCE) > MAX_METRIC_AT_ONCE
    # all 40 '=' match at once in a run of them, but its DFA has 41 states: a match's 40 are read one by one
    assert regex_cost.at_once("={40}(?P<value>[0-9]+)", MAX_METRIC_AT_ONCE) == 1
    with pytest.raises(regex_cost.Unbounded, match="more than 1000 places"):
        regex_cost.at_once("(?P<value>(.*a){1000})", MAX_METRIC_AT_ONCE)


def test_regexes_people_write_are_read_over_a_mib():
    stdout = output()
    assert len(stdout.encode()) == MIB
    for regex, value in ORDINARY.items():
        metric_pattern(regex)
        read = read_metrics(ran(stdout), [MetricSpec(name="m", regex=regex)])
        assert ([(s.metric, s.value) for s in read.samples], read.unread) == ([("m", value)], []), regex


def test_a_stored_regex_the_coordinator_now_refuses_is_not_read_and_says_why():
    read = read_metrics(ran("a" * 65536 + "\n" + '{"metric": "fps", "value": 60}\n'),
                        [MetricSpec(name="fps"), MetricSpec(name="decode_ms", regex="(?P<value>(.*a){1000})")])
    assert [(s.metric, s.value) for s in read.samples] == [("fps", 60)]
    assert len(read.unread) == 1 and read.unread[0].startswith(
        "metric decode_ms: a worker reads its regex with RE2, which would work too hard at it: "), read.unread


def test_a_search_past_the_cpu_it_is_given_is_cut_and_says_so():
    """A regex RE2 reads at few places a byte can still hold a worker: each search for its
    next match here reads to the end of the output (its optional tail might match there), so
    finding all 131072 would take some 40 s of CPU. It is cut at its CPU, and says so; the
    others are read."""
    regex = "(?P<value>[0-9])(?s:.*x)?"
    metric_pattern(regex)  # (the coordinator takes it)
    started = time.thread_time()
    read = read_metrics(ran("7" * 131072 + '\n{"metric": "fps", "value": 60}\n'),
                        [MetricSpec(name="fps"), MetricSpec(name="digit", regex=regex)])
    spent = time.thread_time() - started
    assert [(s.metric, s.value) for s in read.samples] == [("fps", 60)]
    assert len(read.unread) == 1, read.unread
    assert read.unread[0].startswith(f"metric digit: its regex was cut after {METRIC_CPU_S_PER_MIB:g} s of CPU over "
                                     "0.13 MiB of output"), read.unread
    assert read.unread[0].endswith("it matched too often, or searched far past its matches"), read.unread
    assert spent < 3 * METRIC_CPU_S_PER_MIB  # (the budget, and the one search under way then)
