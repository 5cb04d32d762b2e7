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

from device_loop.coordinator import answer_json, mcp_tools
from device_loop.coordinator.answer_json import LARGE_ANSWER, answer_bytes, larger_than, pieces, small
from device_loop.coordinator.calls import CALLS
from device_loop.coordinator.jobs import runs_cursor
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
    for value in (answer, [answer, answer], [], {}, "text", 3, {"a": 1, "b": "c"}):
        assert b"".join(pieces(value)) == JSONResponse(value).body
    with pytest.raises(ValueError):
        b"".join(pieces({"runs": [float("nan")]}))  # as JSONResponse refuses it
    assert not larger_than(answer, LARGE_ANSWER) and not larger_than([answer] * 20, LARGE_ANSWER)
    assert larger_than({"runs": [{"output_tail": "x" * 4000}] * 100}, LARGE_ANSWER)
    assert larger_than([{"name": f"d{n}", "state": "idle", "tags": ["a", "b"]} for n in range(10_000)], LARGE_ANSWER)
    assert json.loads(b"".join(pieces({"runs": list(range(3))}))) == {"runs": [0, 1, 2]}


def lopsided_job(runs: int = 40) -> dict:
    """A job's answer whose first run is tiny and the others as large as a run is reported
    (128 KiB): what one item tells of a list is nothing."""
    big = {"cell": 0, "attempt": 0, "arm": "run", "output_tail": "y" * (127 << 10)}
    return {"id": "job-1", "state": "done", "run_count": runs, "runs_next": None,
            "runs": [{"cell": 0, "attempt": 0, "seq": 0, "arm": "run"}] + [{**big, "seq": n} for n in range(1, runs)]}


@pytest.fixture
def threads(monkeypatch):
    """The calls answer_json hands to a thread, and the bytes the event loop rendered before."""
    handed: list[int] = []
    real = asyncio.to_thread

    async def spy(function, *args):
        handed.append(1)
        return await real(function, *args)

    monkeypatch.setattr(answer_json.asyncio, "to_thread", spy)
    return handed


async def test_an_answer_whose_first_run_is_small_is_still_rendered_in_a_thread(threads):
    job = lopsided_job()
    on_loop = 0
    for part in pieces(job):  # what the loop renders before handing off: at most the bound and one run
        on_loop += len(part)
        if on_loop > LARGE_ANSWER:
            break
    assert on_loop < LARGE_ANSWER + (130 << 10)
    assert await answer_bytes(job) == JSONResponse(job).body and threads == [1]


async def test_a_small_answer_is_rendered_on_the_event_loop(threads):
    lease = {"id": "lease-1", "device": "sim-0", "state": "ready", "expires_at": 1.5, "endpoints": {"uart": "h:1"},
             "tags": ["a", "b"], "reason": None}
    assert small(lease) and await answer_bytes(lease) == JSONResponse(lease).body and threads == []
    devices = [{"name": f"d{n}", "state": "idle", "tags": ["a"]} for n in range(100)]  # not small, under the bound
    assert not small(devices) and await answer_bytes(devices) == JSONResponse(devices).body and threads == []
    assert not small({"output": "x" * 20_000}) and not small({"runs": [0] * 1_000_000})


async def test_a_tool_answer_is_cut_to_its_bound_where_paging_goes_on():
    by_name = {call.name: call for call in CALLS}
    job = lopsided_job()
    shown = await mcp_tools._within_bound(by_name["job_status"], job)
    assert 1 < len(shown["runs"]) < len(job["runs"]) and len(JSONResponse(shown).body) <= mcp_tools.TOOL_ANSWER
    assert shown["runs_next"] == runs_cursor(shown["runs"][-1]) and shown["run_count"] == job["run_count"]
    page = {"runs": job["runs"], "run_count": 40, "next": None}
    assert (await mcp_tools._within_bound(by_name["job_runs"], page))["next"] is not None
    devices = [{"name": f"d{n}", "tags": ["t"] * 20} for n in range(20_000)]
    listed = await mcp_tools._within_bound(by_name["list_devices"], devices)
    assert listed["left_off"] == len(devices) - len(listed["devices"]) > 0
    assert len(JSONResponse(listed["devices"]).body) <= mcp_tools.TOOL_ANSWER
    small = [{"name": "d0"}]
    assert await mcp_tools._within_bound(by_name["list_devices"], small) == {"devices": small}
