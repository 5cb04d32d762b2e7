"""The evidence markdown, the terminal table and the charts (core/ab/evidence.py, core/ab/charts.py):
every section there, hostile text escaped wherever it lands, a matrix's not-run cell kept."""
from __future__ import annotations

import re
import tomllib
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from device_loop.core.ab import abstats, charts, evidence
from device_loop.core.ab.jobs import (ABSpec, CellReport, Fingerprint, JobSpec, JobView, MatrixSpec, MetricSpec, Readings,
                                   RunRecord, Sample)
from device_loop.core.vocabulary import Arm, JobState

HOSTILE = "evil|dev\nname`x`<script>alert(1)</script>&amp;[link](http://x)**b**\x1b[31m"
FORGE = "https://evil.example/x www.evil.example @alice @org/team #1 ann@evil.example"
HOSTILE_COMMAND = "make && ./bench | tee out\n```\n</code><img src=x onerror=alert(1)>"


def runs_for(cell, factor, rounds=10, seed=0, metric="workload_ms", unit="ms", warmup=1):
    rng = np.random.default_rng(seed)
    runs = []
    for seq in range(2 * (rounds + warmup)):
        arm = Arm.A if seq % 2 == 0 else Arm.B
        value = 100.0 * (1.0 if arm is Arm.A else factor) * (1 + 0.004 * rng.standard_normal())
        runs.append(RunRecord(cell=cell, seq=seq, arm=arm, warmup=seq < 2 * warmup, started_at=1.7e9 + seq * 3,
                              ended_at=1.7e9 + seq * 3 + 1, status=0,
                              readings=Readings(temperatures={"cpu": 40 + seq % 3}, governor="performance",
                                                freq_khz=1800000, load=0.25,
                                                unfit="cpu at 52.0 °C, above 45 °C" if seq == 5 else None),
                              samples=[Sample(metric=metric, value=value, unit=unit)]))
    return runs


def fingerprint(device, isa, **extra):
    return Fingerprint(device=device, device_class="board", host="lab-1", channel="console",
                       kernel="Linux 6.6.0 | aarch64", cpu_model="4x Cortex-A55", isa=isa, cores=4, online="0-3",
                       cpufreq=[{"policy": "policy0", "governor": "performance", "cur_khz": "1800000"}],
                       thermal={"cpu": 41.5}, memory_kb=4_000_000, image="rootfs.img", image_sha256="c" * 64,
                       device_loop_version="0.1.0", **extra)


def ab_job(title="SIMD decode", device="board-1", baseline=("run-workload --cost 1.0",),
           patch=("run-workload --cost 0.95",), factor=0.95, emulated=False):
    spec = JobSpec(title=title, target={"device": device[:64]} if "\n" not in device else {},
                   setup=["echo setup"], ab=ABSpec(baseline=list(baseline), patch=list(patch), rounds=10),
                   metrics=[MetricSpec(name="workload_ms", unit="ms")])
    cells = [CellReport(cell=0, device=device[:64], lease_id="L1",
                        fingerprint=fingerprint(device[:64], ["fp", "asimd", "sve2"], emulated=emulated,
                                                extra={"board.rev": "B|3 <i>"}))]
    return JobView(id="job-1", owner="ann", kind="interactive", state=JobState.DONE, spec=spec, created_at=1.7e9,
                   started_at=1.7e9 + 1, ended_at=1.7e9 + 80, worker="ann@laptop", cells=cells,
                   runs=runs_for(0, factor), coordinator_version="0.1.0")


def matrix_job():
    spec = JobSpec(title="matrix", ab=ABSpec(baseline=["a"], patch=["b"], rounds=10),
                   matrix=MatrixSpec(over=["tags=sve2", "tags=rvv", "tags=avx2"]),
                   metrics=[MetricSpec(name="workload_ms", unit="ms")])
    cells = [CellReport(cell=0, group="tags=sve2", device="arm-1", fingerprint=fingerprint("arm-1", ["asimd", "sve2"])),
             CellReport(cell=1, group="tags=rvv", device="rv-1", fingerprint=fingerprint("rv-1", ["i", "m", "v"])),
             CellReport(cell=2, group="tags=avx2", not_run="no device")]
    return JobView(id="job-2", owner="ann", kind="batch", state=JobState.DONE, spec=spec, created_at=1.7e9,
                   cells=cells, runs=runs_for(0, 0.95, seed=1) + runs_for(1, 1.05, seed=2))


def render(job):
    analysis = abstats.analyse(job.spec, job.runs, job.cells)
    return evidence.markdown(job, analysis), analysis


def test_markdown_has_every_section_and_the_claim_in_numbers():
    text, analysis = render(ab_job())
    assert text.startswith("# SIMD decode\n")
    claim = re.search(r"workload_ms on board-1: \*\*B \(patch\) is (\d\.\d)% faster than A \(baseline\)\*\*: "
                      r"ratio B/A (0\.\d+) \[0\.\d+, 0\.\d+\] \(95% CI\), p = \S+ \(Holm\), 10\+10 runs\.", text)
    assert claim and 4.5 <= float(claim.group(1)) <= 5.5, text[:600]
    for heading in ("## Results", "## Warnings", "## Drift", "## Devices", "## Runs", "## Commands",
                    "## Images and versions", "## Method", "## Reproduce"):
        assert f"\n{heading}\n" in text, heading
    assert "| metric      | A ±" in text and "| delta [CI]" in text and "| p (Holm) |" in text
    assert "different: B is" in text and "10+10" in text
    assert "1 of 20 runs marked unfit" in text                  # the warning says how many runs were marked
    assert "- kernel: Linux 6.6.0 \\| aarch64" in text and "- image sha256: " + "c" * 64 in text
    assert "- fact board.rev: B\\|3 &lt;i&gt;" in text
    assert "run-workload --cost 0.95" in text and "echo setup" in text
    assert "device-loop run --from-job job-1" in text and "device-loop run job.toml" in text
    toml = re.search(r"```toml\n(.*?)\n```", text, re.S).group(1)
    assert JobSpec.model_validate(tomllib.loads(toml)) == ab_job().spec      # the spec inline is the job's
    assert "Hodges-Lehmann" in text and "Holm-Bonferroni" in text
    assert "device-loop (coordinator): 0.1.0" in text and "device-loop (worker): 0.1.0" in text
    # a row per run, warmup included, with its start time and temperature
    rows = re.findall(r"^\| (\d+) +\| ([AB]) +\| (yes)? +\| (2023-11-14 \d\d:\d\d:\d\dZ) \| (\d+\.\d) ", text, re.M)
    assert len(rows) == 22 and rows[0][2] == "yes" and rows[2][2] == ""


def _outside_fences(text):
    return re.sub(r"^(`{3,})[^\n]*\n.*?^\1$", "", text, flags=re.S | re.M)


def test_hostile_text_is_escaped_everywhere():
    job = ab_job(title=HOSTILE, device=HOSTILE, baseline=(HOSTILE_COMMAND,), patch=("x `y` | z",))
    text, _ = render(job)
    prose = _outside_fences(text)
    assert "<script" not in prose and "<img" not in prose and "<i>" not in prose and "\x1b" not in text
    assert "](http" not in prose.replace("\\](http", "")
    assert "**b**" not in prose
    # every table row keeps its number of cells: no unescaped | came in
    for block in re.findall(r"((?:^\|.*\|\n)+)", prose, re.M):
        counts = {len(re.findall(r"(?<!\\)\|", line)) for line in block.splitlines()}
        assert len(counts) == 1, block
    # the device name stays on one line in prose
    assert "evil\\|dev name" in prose
    # the commands are verbatim in a fence longer than their backticks
    fenced = re.search(r"^(`{4,})sh\n(.*?)\n\1$", text, re.S | re.M)
    assert fenced and HOSTILE_COMMAND in fenced.group(2)


def test_matrix_summary_keeps_the_cell_that_did_not_run():
    text, analysis = render(matrix_job())
    summary = text.split("## Summary\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in summary.splitlines() if line.startswith("| ") and not line.startswith("| cell")
            and not line.startswith("| ---")]
    assert len(rows) == 3
    assert "arm-1" in rows[0] and "asimd sve2" in rows[0] and "different: B is" in rows[0]
    assert "rv-1" in rows[1] and "| v " in rows[1] and "slower" in rows[1]
    assert "tags=avx2" in rows[2] and "not run: no device" in rows[2]
    assert "Not run (tags=avx2): no device." in text
    assert "cell 2 (tags=avx2): not run: no device" in text


def test_warnings_for_few_runs_and_emulated_devices():
    job = ab_job(emulated=True)
    job = job.model_copy(update={"runs": [r for r in job.runs if r.seq < 8], "spec": job.spec})
    text, analysis = render(job)
    warnings = text.split("## Warnings\n", 1)[1].split("\n## ", 1)[0]
    assert "board-1 is emulated: not for timing" in warnings
    assert "too few runs for the test ever to decide: 3+3" in warnings
    assert "fewer than 6 runs a side" in warnings
    assert "± ∞" in text and "undecided" in text


def test_plain_job():
    spec = JobSpec(run=["bench"], rounds=4, metrics=[MetricSpec(name="t", unit="s")])
    runs = [RunRecord(seq=i, arm=Arm.RUN, started_at=1.7e9 + i, ended_at=1.7e9 + i + 1, status=0,
                      samples=[Sample(metric="t", value=1.0 + i / 10)]) for i in range(4)]
    job = JobView(id="j3", owner="o", kind="interactive", state=JobState.DONE, spec=spec, created_at=1.7e9, runs=runs)
    text, analysis = render(job)
    assert "t: median 1.15 s, 4 runs." in text and "| t      | 1.15 s ± ∞ | 4   |" in text
    assert "run (each round):" in text
    table = evidence.terminal_table(analysis)
    assert table.splitlines()[0].split() == ["metric", "median", "n"]


def test_terminal_table_lines_up_and_strips_escapes():
    job = ab_job(device=HOSTILE)
    analysis = abstats.analyse(job.spec, job.runs, job.cells)
    table = evidence.terminal_table(analysis)
    lines = table.splitlines()
    header = next(line for line in lines if line.startswith("metric"))
    assert header.split() == ["metric", "A", "B", "delta", "[CI]", "p", "(Holm)", "n", "verdict"]
    row = lines[lines.index(header) + 1]
    for column in ("A", "B", "delta", "p (Holm)", "n", "verdict"):       # each value starts under its heading
        at = header.index(f" {column}") + 1
        assert row[at - 2:at] == "  " and row[at] != " ", column
    assert re.search(r"workload_ms +\d+(\.\d+)? ms ± \d\.\d% +9\d(\.\d+)? ms ± \d\.\d% +-\d\.\d% \[", row)
    assert "\x1b" not in table and "\n" not in row
    assert any(line.startswith("warning: 1 of 20 runs marked unfit") for line in lines)
    matrix = abstats.analyse(matrix_job().spec, matrix_job().runs, matrix_job().cells)
    text = evidence.terminal_table(matrix, matrix_job())
    assert "cell 2 tags=avx2: not run: no device" in text
    summary = text.splitlines()[text.splitlines().index("matrix") + 1:]
    assert summary[0].split()[:5] == ["cell", "group", "device", "fidelity", "ISA"]
    assert [row.split()[0] for row in summary[1:4]] == ["0", "1", "2"], "a row per cell, the one not run too"


def test_what_a_forge_would_link_or_notify_is_a_code_span():
    """A forge (GitHub) links a bare URL and notifies an @mention or an issue however they are
    backslash-escaped: in a code span they are only text."""
    said = "see https://evil.example/a_b?x=1&y=2, www.evil.example, ann@laptop, @alice, @org/team, #12 now"
    assert evidence.md(said) == ("see `https://evil.example/a_b?x=1&y=2,` `www.evil.example,` `ann@laptop,` "
                                 "`@alice,` `@org/team,` `#12` now")
    assert evidence.md("a|@bob|c") == "a\\|`@bob`\\|c", "a table cell stays one cell"
    assert evidence.md("workload_ms #x (www.x.org)") == "workload_ms \\#x (`www.x.org`)"
    job = ab_job(title=f"{FORGE} title", device="board-1")
    job = job.model_copy(update={"worker": FORGE, "reason": FORGE, "cells": [job.cells[0].model_copy(update={
        "fingerprint": fingerprint("board-1", ["fp"], extra={"board.rev": FORGE}).model_copy(
            update={"kernel": FORGE})})]})
    prose = _outside_fences(render(job)[0])
    bare = re.sub(r"`[^`]*`", "", prose)  # what is not in a code span
    assert not re.search(r"://|@|www\.|#\d", bare), [line for line in bare.splitlines() if re.search("[@:#]", line)]
    assert prose.count("`@alice`") >= 4


def test_the_spec_shows_what_its_author_set_and_no_default_beside_the_real_one():
    spec = JobSpec(ab=ABSpec(baseline=["a"], patch=["b"], rounds=6), metrics=[MetricSpec(name="ms")])
    toml = evidence.spec_toml(spec)
    top = toml.split("\n[ab]\n")[0]
    assert "title" not in top and "rounds" not in top, toml
    assert re.search(r"^\[ab\]\n(.*\n)*rounds = 6$", toml, re.M) and JobSpec.model_validate(tomllib.loads(toml)) == spec
    plain = JobSpec(title="t", run=["x"], rounds=3, command_timeout_s=60)
    assert tomllib.loads(evidence.spec_toml(plain)) == {"title": "t", "run": ["x"], "rounds": 3,
                                                        "command_timeout_s": 60}
    assert "rounds" not in evidence.spec_toml(JobSpec(run=["x"]))


def test_escaping_helpers():
    assert evidence.md("a|b\nc") == "a\\|b c"
    assert evidence.md("<b>&") == "&lt;b&gt;&amp;"
    assert evidence.md("workload_ms") == "workload_ms" and evidence.md("_x_") == "\\_x\\_"
    assert evidence.fence("a ```` b") == "`````\na ```` b\n`````"
    assert evidence.plain("a\x1b[2Jb\r\nc\x00") == "a[2Jb c"


@pytest.mark.parametrize("job", [ab_job(title=HOSTILE, device=HOSTILE), matrix_job()], ids=["hostile", "matrix"])
def test_svg_is_well_formed_and_escaped(job):
    analysis = abstats.analyse(job.spec, job.runs, job.cells)
    text = charts.svg(job, analysis)
    root = ET.fromstring(text)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    names = {el.tag.split("}")[1] for el in root.iter()}
    assert names <= {"svg", "title", "rect", "circle", "polyline", "text"}
    texts = " ".join(el.text or "" for el in root.iter())
    assert "<script>" not in text and "\x1b" not in text
    circles = [el for el in root.iter("{http://www.w3.org/2000/svg}circle")]
    colours = {el.get("stroke") for el in circles if el.get("stroke")}
    assert {charts._hex("A"), charts._hex("B"), charts._hex("warmup")} <= colours
    assert any(el.get("fill") == "none" for el in circles)          # the marked run is hollow
    assert root.iter("{http://www.w3.org/2000/svg}polyline")        # temperature
    if job.id == "job-1":
        assert "<script>alert(1)</script>" in texts                  # shown as text, not markup


def test_png_is_written(tmp_path):
    job = matrix_job()
    path = tmp_path / "chart"                                          # no suffix: PNG all the same
    charts.png(job, abstats.analyse(job.spec, job.runs, job.cells), path, scale=1)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000


def test_a_hostile_unit_is_escaped_in_tables_and_charts():
    unit = "<b>|`x`\n&"[:16]
    job = ab_job()
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"metrics": [MetricSpec(name="m", unit=unit)]}),
                                 "runs": runs_for(0, 0.95, metric="m", unit=unit)})
    text, analysis = render(job)
    prose = _outside_fences(text)
    assert "<b>" not in prose and "&lt;b&gt;\\|\\`x\\` &amp;" in prose
    for block in re.findall(r"((?:^\|.*\|\n)+)", prose, re.M):
        assert len({len(re.findall(r"(?<!\\)\|", line)) for line in block.splitlines()}) == 1, block
    ET.fromstring(charts.svg(job, analysis))
    lines = evidence.terminal_table(analysis).splitlines()               # a terminal: one line, no escapes
    row = lines[next(i for i, line in enumerate(lines) if line.startswith("metric")) + 1]
    assert row.startswith("m ") and "ms" not in row and "<b>|`x` &" in row


def test_the_evidence_says_what_each_arm_s_last_run_printed_last():
    def ran(seq: int, arm: Arm, said: str, warmup: bool = False, status: int = 0) -> RunRecord:
        return RunRecord(seq=seq, arm=arm, warmup=warmup, started_at=float(seq), ended_at=seq + 0.5, status=status,
                         output_tail=said)

    runs = [ran(0, Arm.A, "warm\n", warmup=True), ran(1, Arm.A, "a first\n"), ran(2, Arm.B, "b first\n"),
            ran(3, Arm.A, "".join(f"line {n}\n" for n in range(9)) + "x" * 300 + "\n"),
            ran(4, Arm.B, "", status=1)]
    said = "\n".join(evidence.printed(runs))
    assert "Run 3 (A) exited 0, and printed last:" in said and "Run 4 (B) exited 1, printing nothing." in said
    assert "line 5" in said and "line 4" not in said, "its last lines"
    assert "x" * 200 in said and "x" * 201 not in said, "each line bounded"
    assert "warm" not in said and "first" not in said, "the last run of each arm, not a warmup"
