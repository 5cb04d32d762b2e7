"""Jobs for agents through the MCP route (docs/architecture.md, "Jobs and evidence"): an agent
submits a job (batch, whatever its token), follows it with job_status and gets the evidence
markdown once a worker of its user ran it; tools refuse what REST refuses. In-process: the
SDK's client over the app itself."""
import asyncio

import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from device_loop.coordinator.identity import issue_token
from lab_in_process import in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SPEC = {"title": "decode", "target": {"class": "sim-board"}, "metrics": [{"name": "decode_ms", "unit": "ms"}],
        "ab": {"baseline": ["run-workload --cost 1.0"], "patch": ["run-workload --cost 0.95"], "rounds": 6,
               "warmup": 0}}


def agent(app, token: str) -> Client:
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), headers={"Authorization": f"Bearer {token}"},
                              timeout=30)
    return Client(streamable_http_client("http://127.0.0.1/mcp", http_client=http))


async def call(client: Client, tool: str, **args):
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    return result.structured_content


async def test_an_agent_submits_a_job_follows_it_and_gets_its_evidence(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        token = (await issue_token(rules.store, clock, "ann"))["token"]  # a person's token: MCP makes it batch
        other = (await issue_token(rules.store, clock, "eve"))["token"]
        app = client()._transport.app  # (the lab's app, as its clients reach it)
        worker = client(token=token)
        async with agent(app, token) as ann, agent(app, other) as eve:
            job = await call(ann, "submit_job", spec=SPEC)
            assert job["state"] == "queued" and job["kind"] == "batch" and job["owner"] == "ann"
            refused = await eve.call_tool("job_status", {"job_id": job["id"]})
            assert refused.is_error and "[unknown_job]" in refused.content[0].text
            bad = await ann.call_tool("submit_job", {"spec": {"run": []}})
            assert bad.is_error and "[invalid]" in bad.content[0].text

            following = asyncio.create_task(call(ann, "job_status", job_id=job["id"], wait_s=30, unless="queued"))
            claimed = (await worker.post("/jobs/claim", json={})).json()["job"]
            assert claimed["id"] == job["id"]
            assert (await following)["state"] == "running"
            for seq in range(12):
                value = 10 - seq % 2 * 0.5 + seq / 100
                await worker.post(f"/jobs/{job['id']}/runs", json={
                    "seq": seq, "arm": "AB"[seq % 2], "started_at": 1.0 + seq, "ended_at": 1.5 + seq, "status": 0,
                    "samples": [{"metric": "decode_ms", "value": value}]})
            await worker.post(f"/jobs/{job['id']}/finish", json={"state": "done"})
            done = await call(ann, "job_status", job_id=job["id"], wait_s=30, unless="running")
            assert done["state"] == "done" and len(done["runs"]) == 12 == done["run_count"]
            brief = await call(ann, "job_status", job_id=job["id"], runs=False)
            assert (brief["runs"], brief["run_count"], brief["analysis"] is not None) == ([], 12, True)
            evidence = await call(ann, "job_evidence", job_id=job["id"])
            assert job["id"] in evidence["result"] and "decode_ms" in evidence["result"]
            assert (await eve.call_tool("job_evidence", {"job_id": job["id"]})).is_error
            no_lease = await ann.call_tool("exec", {"lease_id": "lease-0000", "command": "true"})
            assert no_lease.is_error and "[unknown_lease]" in no_lease.content[0].text
            too_long = await ann.call_tool("exec", {"lease_id": "lease-0000", "command": "true", "timeout_s": 121})
            assert too_long.is_error and "[invalid]" in too_long.content[0].text
