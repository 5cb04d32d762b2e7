"""The jobs' web pages: a person's jobs, and a job's page (state, cells, runs, the analysis,
a chart), shown only to who may read the job, with everything a worker reported escaped."""
import pytest

from device_loop.coordinator.identity import issue_token
from lab_in_process import in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SPEC = {"title": "decode <b>fast</b>", "target": {"class": "sim-board"},
        "metrics": [{"name": "decode_ms", "unit": "ms"}],
        "ab": {"baseline": ["run-workload --cost 1.0"], "patch": ["run-workload --cost 0.95"], "rounds": 6,
               "warmup": 0}}


def run(seq: int, arm: str, value: float) -> dict:
    return {"seq": seq, "arm": arm, "started_at": 1_800_000_000.0 + seq, "ended_at": 1_800_000_001.0 + seq,
            "status": 0, "readings": {"temperatures": {"cpu": 40.0}, "unfit": "<script>x</script>"},
            "samples": [{"metric": "decode_ms", "value": value, "unit": "ms"}],
            "output_tail": f"warming\nloaded\ndecoded {seq} <i>frames</i>\ndecode_ms {value}\n"}


async def test_a_jobs_page_shows_its_runs_and_analysis_escaped_to_its_readers_only(tmp_path):
    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        t = {n: (await issue_token(rules.store, clock, n))["token"] for n in ("ann", "eve")}
        ann, eve = client(token=t["ann"]), client(token=t["eve"])
        job = (await ann.post("/jobs", json={"spec": SPEC, "claim": True})).json()
        await ann.post(f"/jobs/{job['id']}/cells", json={"cell": 0, "device": "b0", "fingerprint": {
            "device": "b0", "isa": ["rvv", "<img src=x onerror=alert(1)>"], "kernel": "Linux b0"}})
        for seq in range(12):
            await ann.post(f"/jobs/{job['id']}/runs", json=run(seq, "AB"[seq % 2], 10 - seq % 2 * 0.5 + seq / 100))
        page = await ann.get(f"http://127.0.0.1/jobs/{job['id']}")
        assert page.status_code == 200, page.text
        html = page.text
        assert "decode &lt;b&gt;fast&lt;/b&gt;" in html and "<b>fast</b>" not in html
        assert "<img src=x" not in html and "&lt;img src=x" in html
        assert "<script>x</script>" not in html
        assert "Analysis" in html and "decode_ms" in html and "rvv" in html
        assert "<svg" in html and "<script" not in html.split("<svg", 1)[1].split("</svg>", 1)[0]
        assert html.count('class="arm a-A"') == 6 and html.count('class="arm a-B"') == 6
        # each run's last three lines of output, escaped
        assert '<code class="tail">loaded\ndecoded 11 &lt;i&gt;frames&lt;/i&gt;\ndecode_ms ' in html
        assert "warming" not in html and "<i>frames" not in html
        assert f"/api/v1/jobs/{job['id']}/evidence" in html and 'data-act="cancel-job"' in html

        listing = (await ann.get("http://127.0.0.1/jobs")).text
        assert job["id"] in listing and "decode &lt;b&gt;" in listing
        assert job["id"] not in (await eve.get("http://127.0.0.1/jobs")).text
        hidden = await eve.get(f"http://127.0.0.1/jobs/{job['id']}")
        assert hidden.status_code == 404 and "decode" not in hidden.text
        nobody = await client().get(f"http://127.0.0.1/jobs/{job['id']}")
        assert nobody.status_code == 404 and "Sign in" in nobody.text
        board = (await ann.get("http://127.0.0.1/")).text
        assert 'href="/jobs"' in board


def delta_cells(html: str) -> list[str]:
    """The text of each Delta cell of a job page's analysis, tags taken out."""
    import re
    cells = re.findall(r'<td data-label="Delta">(.*?)</td>', html, re.S)
    return [" ".join(re.sub(r"<[^>]+>", " ", cell).split()) for cell in cells]


async def test_the_delta_shows_its_interval_and_an_unknown_one_its_measure_too(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        decided = (await api.post("/jobs", json={"spec": SPEC, "claim": True})).json()
        for seq in range(12):
            await api.post(f"/jobs/{decided['id']}/runs", json=run(seq, "AB"[seq % 2], 10 - seq % 2 * 0.5 + seq / 100))
        (shown,) = delta_cells((await api.get(f"http://127.0.0.1/jobs/{decided['id']}")).text)
        assert shown.startswith("-4.") and " [-" in shown and shown.endswith("] B is 4.9% faster"), shown

        unsure = (await api.post("/jobs", json={"spec": SPEC, "claim": True})).json()
        noisy = [10.0, 10.1, 11.0, 9.8, 9.0, 10.9, 10.5, 9.6, 9.5, 10.4, 10.2, 10.0]  # A and B overlap
        for seq, value in enumerate(noisy):
            await api.post(f"/jobs/{unsure['id']}/runs", json=run(seq, "AB"[seq % 2], value))
        (shown,) = delta_cells((await api.get(f"http://127.0.0.1/jobs/{unsure['id']}")).text)
        assert "%, " in shown and "] collect more: about " in shown, f"the measured delta, then the hint: {shown}"
