"""Large answers are built off the event loop (docs/architecture.md, "Shares of one lab"):
while a job with thousands of runs is read, /health keeps answering; and an answer rendered
in pieces is the bytes JSONResponse renders."""
from __future__ import annotations

import asyncio
import json
import sys
import time
import types

import device_loop.core.ab

import pytest
from starlette.responses import JSONResponse

from device_loop.coordinator.api import LARGE_ANSWER, _in_pieces, _larger_than
from lab_in_process import in_process_lab
from test_job_shares import LONG
from test_jobs_api import submitted

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

RUNS = 1500


def big_run(job_id: str, seq: int) -> dict:
    """A run as large as a run gets (its output tail, 16 samples, 64 temperatures: ~10 KB)."""
    return {"job": job_id, "cell": 0, "attempt": 0, "seq": seq, "arm": "run", "warmup": False,
            "started_at": 1000.0 + seq, "ended_at": 1000.5 + seq, "status": 0,
            "readings": {"temperatures": {f"zone{z}": 40.0 + z / 10 for z in range(64)}},
            "samples": [{"metric": f"m{i}", "value": 1.0 + seq % 7, "unit": "ms"} for i in range(16)],
            "output_tail": ("x" * 79 + "\n") * 50, "failure": None}


@pytest.fixture
def quick_analysis(monkeypatch):
    """The analysis of a job's runs, at once (scipy's is seconds of CPU in its thread: the test
    reads what the coordinator does around it)."""
    quick = types.ModuleType("device_loop.core.ab.abstats")
    quick.analyse = lambda spec, runs, cells: {"runs": len(runs)}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "device_loop.core.ab.abstats", quick)
    monkeypatch.setattr(device_loop.core.ab, "abstats", quick, raising=False)


async def test_health_answers_while_a_big_job_is_read(tmp_path, quick_analysis):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        alice, anyone = client("alice"), client("bob")
        job = await submitted(alice, LONG)
        async with rules.store.tx():
            for seq in range(RUNS):
                await rules.jobs.jobs_sql.insert_job_run(big_run(job["id"], seq))  # type: ignore[arg-type]
        began = time.perf_counter()
        reading = asyncio.create_task(alice.get(f"/jobs/{job['id']}"))
        longest, last = 0.0, began
        while not reading.done():  # the longest the event loop left /health unanswered
            assert (await anyone.get("/health")).status_code == 200
            answered = time.perf_counter()
            longest, last = max(longest, answered - last), answered
            await asyncio.sleep(0)  # (the in-process /health never suspends: the read gets its turn)
        took = time.perf_counter() - began
        read = (await reading).json()
        assert read["run_count"] == RUNS and read["analysis"] == {"runs": RUNS}
        assert longest < took / 4, f"/health went unanswered for {longest:.2f} s of the read's {took:.2f} s"


def test_an_answer_rendered_in_pieces_is_what_json_response_renders():
    answer = {"id": "job-1", "runs": [{"seq": n, "text": "é\u2028\"", "v": [1.5, None, True]} for n in range(50)],
              "nested": {"a": [[]], "b": {}}, "empty": [], "count": 3}
    for value in (answer, [answer, answer], [], {}, "text", 3):
        assert _in_pieces(value, 2) == JSONResponse(value).body
    with pytest.raises(ValueError):
        _in_pieces({"runs": [float("nan")]}, 2)  # as JSONResponse refuses it
    assert not _larger_than(answer, LARGE_ANSWER) and not _larger_than([answer] * 20, LARGE_ANSWER)
    assert _larger_than({"runs": [{"output_tail": "x" * 4000}] * 100}, LARGE_ANSWER)
    assert _larger_than([{"name": f"d{n}", "state": "idle", "tags": ["a", "b"]} for n in range(10_000)], LARGE_ANSWER)
    assert json.loads(_in_pieces({"runs": list(range(3))}, 2)) == {"runs": [0, 1, 2]}
