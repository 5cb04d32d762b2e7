"""A job's page in a real browser (Debian's Chromium, driven by Playwright): its runs, the
analysis and the chart; it shows the job's end by itself when the worker finishes it (no
reload); the owner cancels from it. Screenshots are kept in ``test-artifacts/``."""
import getpass
import re

import pytest

from conftest import Coordinator
from test_browser import screenshot

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]
SPEC = {"title": "decode", "target": {"class": "sim-board"}, "metrics": [{"name": "decode_ms", "unit": "ms"}],
        "ab": {"baseline": ["run-workload --cost 1.0"], "patch": ["run-workload --cost 0.95"], "rounds": 6,
               "warmup": 0}}


def job_with_twelve_runs(coordinator, owner: dict) -> dict:
    """A job claimed by its owner, with twelve runs reported (A and B in turn; B 5 % faster)."""
    job = coordinator.api("/jobs", "POST", json={"spec": SPEC, "claim": True}, **owner).json()
    for seq in range(12):
        coordinator.api(f"/jobs/{job['id']}/runs", "POST", json={
            "seq": seq, "arm": "AB"[seq % 2], "started_at": 1_800_000_000.0 + seq,
            "ended_at": 1_800_000_001.0 + seq, "status": 0, "readings": {"temperatures": {"cpu": 40 + seq}},
            "samples": [{"metric": "decode_ms", "value": 10 - seq % 2 * 0.5 + seq / 100}]}, **owner)
    return job


def test_a_jobs_page_follows_its_job_to_its_end(tmp_path, env, browser):
    coordinator = Coordinator(tmp_path, env)  # the trust mode: the page is the lab owner's
    try:
        owner = {"headers": {"X-Device-Loop-User": getpass.getuser()}}
        job = job_with_twelve_runs(coordinator, owner)
        other = coordinator.api("/jobs", "POST", json={"spec": SPEC, "claim": True}, **owner).json()

        page = browser.new_context(viewport={"width": 1366, "height": 900}).new_page()
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{coordinator.url}/jobs/{job['id']}")
        page.wait_for_selector(".chart svg")
        assert page.locator(".runs tbody tr").count() == 12
        assert page.locator(".analysis td[data-label=Metric]").first.inner_text().startswith("decode_ms")
        assert page.locator(".state").first.inner_text() == "running"
        screenshot(page, "job-page-running")

        coordinator.api(f"/jobs/{job['id']}/finish", "POST", json={"state": "done"}, **owner)
        page.wait_for_selector(".state.j-done")  # shown by itself: the page follows the job
        assert page.locator("button[data-act=cancel-job]").count() == 0, "an ended job is not cancelled"

        page.goto(f"{coordinator.url}/jobs/{other['id']}")
        page.on("dialog", lambda dialog: dialog.accept())
        page.click("button[data-act=cancel-job]")
        page.wait_for_selector(".state.j-cancelled")
        page.goto(f"{coordinator.url}/jobs")
        assert page.locator("table.jobs tbody tr").count() == 2
        screenshot(page, "jobs-list")
        assert not errors, errors
    finally:
        coordinator.stop()


# the size a chart's text is drawn at: its font-size, times how much the page scaled the SVG
RENDERED_FONT_PX = """() => {
  const svg = document.querySelector(".chart svg");
  const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
  return [...svg.querySelectorAll("text")].map((t) => Number(t.getAttribute("font-size")) * scale);
}"""


def test_at_400_px_the_chart_s_labels_stay_readable_and_the_delta_has_its_interval(tmp_path, env, browser):
    coordinator = Coordinator(tmp_path, env)
    try:
        owner = {"headers": {"X-Device-Loop-User": getpass.getuser()}}
        job = job_with_twelve_runs(coordinator, owner)
        page = browser.new_context(viewport={"width": 400, "height": 800}).new_page()
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{coordinator.url}/jobs/{job['id']}")
        page.wait_for_selector(".chart svg")
        sizes = page.evaluate(RENDERED_FONT_PX)
        assert sizes and min(sizes) >= 10, f"labels drawn at {min(sizes):.1f} px"  # (shrunk to the page: 5 px)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), "only the chart scrolls"
        delta = page.locator(".analysis td[data-label=Delta]").first.inner_text()
        assert re.match(r"-\d+\.\d% \[-\d+\.\d%, -\d+\.\d%\]\s+B is \d+\.\d% faster", delta), delta
        screenshot(page, "job-page-400")

        failed = job_with_twelve_runs(coordinator, owner)  # a reason that is one unbroken word of output
        coordinator.api(f"/jobs/{failed['id']}/finish", "POST", json={"state": "failed", "reason": "x" * 2000}, **owner)
        for path in (f"/jobs/{failed['id']}", "/jobs", "/jobs?all=1"):
            page.goto(f"{coordinator.url}{path}")
            page.wait_for_selector(".why")
            assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), f"{path} is wider"
        assert not errors, errors
    finally:
        coordinator.stop()
