"""The evidence cut to fit a pull-request comment or a step summary (core/ab/comment.py;
docs/architecture.md, "Results where CI shows them")."""
from __future__ import annotations

import re

from device_loop.core.ab import abstats, evidence
from device_loop.core.ab.comment import PR_COMMENT_BYTES, fit, page_link
from device_loop.core.ab.jobs import ABSpec, CellReport, JobSpec, JobView, MatrixSpec, MetricSpec
from device_loop.core.vocabulary import JobState
from test_evidence import ab_job, fingerprint, runs_for

URL = "http://lab.example:7420/jobs/job-1"


def big_matrix(cells=16, rounds=100) -> JobView:
    """The largest evidence a job makes, near enough: 16 cells of 200 runs, five metrics."""
    groups = [f"tags=isa{i}" for i in range(cells)]
    spec = JobSpec(title="big", ab=ABSpec(baseline=["a"], patch=["b"], rounds=rounds),
                   metrics=[MetricSpec(name=f"metric_{i}", unit="ms") for i in range(5)],
                   matrix=MatrixSpec(over=groups))
    runs = [r for i in range(cells) for r in runs_for(i, 1.0 + i / 100, rounds=rounds, seed=i)]
    reports = [CellReport(cell=i, group=g, device=f"board-{i}", fingerprint=fingerprint(f"board-{i}", ["fp"]))
               for i, g in enumerate(groups)]
    return JobView(id="job-1", owner="ann", kind="interactive", state=JobState.DONE, spec=spec, created_at=1.7e9,
                   cells=reports, runs=runs)


def whole(job: JobView) -> str:
    return evidence.markdown(job, abstats.analyse(job.spec, job.runs, job.cells))


def fences_balanced(text: str) -> bool:
    opened = None
    for line in text.split("\n"):
        marks = re.match(r"^(`{3,})", line)
        if marks and opened is None:
            opened = marks.group(1)
        elif marks and line.startswith(opened) and not line.strip("`"):
            opened = None
    return opened is None


def test_evidence_that_fits_is_left_whole():
    text = whole(ab_job())
    assert fit(text, PR_COMMENT_BYTES, URL, "job-1") == text


def test_long_tables_are_cut_with_the_link_and_the_claims_kept():
    text = whole(big_matrix())
    assert len(text.encode()) > PR_COMMENT_BYTES * 4
    cut = fit(text, PR_COMMENT_BYTES, URL, "job-1")
    assert len(cut.encode()) < PR_COMMENT_BYTES
    assert f"the whole table is on [the job's page]({URL})" in cut
    assert re.search(r"\*\d+ more rows cut to fit", cut)
    # what a reviewer reads first survives: the claims, the summary table's every cell, the method
    for line in text.split("\n")[:20]:
        assert line in cut
    assert "## Summary" in cut and "## Method" in cut and fences_balanced(cut)
    # a note stands after a blank line, or a forge would read it as one more row of its table
    assert all(cut.split("\n")[i - 1] == "" for i, line in enumerate(cut.split("\n")) if "cut to fit" in line)


def test_fences_then_the_end_are_cut_when_tables_are_not_enough():
    long_commands = ["./bench --case " + "x" * 1900 + f" {i}" for i in range(16)]
    job = ab_job(baseline=long_commands, patch=long_commands)
    text = whole(job)
    cut = fit(text, 40_000, URL, "job-1")
    assert len(cut.encode()) < 40_000 and "the whole block is on" in cut and fences_balanced(cut)
    tiny = fit(text, 3_000, URL, "job-1")
    assert len(tiny.encode()) < 3_000 and fences_balanced(tiny)
    assert tiny.rstrip().endswith(f"the whole evidence is on [the job's page]({URL}).*")


def test_the_link_cannot_be_broken_out_of():
    assert page_link("http://lab/jobs/a b)(c[d]", "x") == "[the job's page](http://lab/jobs/a%20b%29%28c%5Bd%5D)"
    assert page_link("", "job`1") == "`device-loop job evidence job1`"


def test_the_step_summary_gets_what_it_has_room_for(tmp_path, monkeypatch):
    from device_loop.cli.ci_results import STEP_SUMMARY, append_step_summary
    from device_loop.core.ab.comment import STEP_SUMMARY_BYTES

    summary = tmp_path / "summary.md"
    monkeypatch.setenv(STEP_SUMMARY, str(summary))
    summary.write_text("an earlier step's words\n")
    append_step_summary(whole(ab_job()), URL, "job-1")
    assert summary.read_text().startswith("an earlier step's words\n\n# SIMD decode")
    summary.write_text("x" * (STEP_SUMMARY_BYTES - 1000))      # nearly full: only the link fits
    append_step_summary(whole(ab_job()), URL, "job-1")
    assert summary.read_text().endswith(f"\nThe evidence is on [the job's page]({URL}).\n")
    assert summary.stat().st_size < STEP_SUMMARY_BYTES
    monkeypatch.setenv(STEP_SUMMARY, str(tmp_path / "no" / "such" / "folder"))
    append_step_summary("# x", URL, "job-1")                   # said on stderr, not fatal


def test_with_outcomes_in_a_step_summary_stand_apart_and_fit(tmp_path, monkeypatch):
    """A `with`'s outcome is appended to $GITHUB_STEP_SUMMARY as a job's evidence is: after a
    blank line (a heading glued to an earlier step's last line is not one), and only its
    verdict line when the summary has no room left for the rest."""
    from device_loop.cli.ci_results import write_command_results
    from device_loop.core.ab.comment import STEP_SUMMARY_BYTES
    from device_loop.core.command_outcome import CommandOutcome

    summary = tmp_path / "summary.md"
    summary.write_text("an earlier step's words")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    passed = CommandOutcome(command=("./ci/test-on-board.sh",), status=0)
    write_command_results(None, passed, None, None)
    write_command_results(None, passed, None, None)
    text = summary.read_text()
    assert text.startswith("an earlier step's words\n\n### device-loop with: passed\n"), text
    assert text.count("\n\n### device-loop with: passed\n") == 2 and "test-on-board.sh" in text
    summary.write_text("x" * (STEP_SUMMARY_BYTES - 100))
    write_command_results(None, passed, None, None)
    assert summary.read_text()[STEP_SUMMARY_BYTES - 100:] == "\n\n### device-loop with: passed\n"
