"""JUnit XML of a job's results (core/ab/junit.py; docs/architecture.md, "Results where CI shows
them"): what becomes a failure, an error and a pass, the fingerprint as properties, text XML
cannot refuse, and every document held to the schema Jenkins and GitLab read."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from device_loop.core.ab import abstats, junit
from device_loop.core.ab.comment import command_markdown
from device_loop.core.ab.jobs import CellReport, JobSpec, JobView, RunRecord
from device_loop.core.command_outcome import CommandOutcome, Timings
from device_loop.core.vocabulary import LAB_FAILURE_STATUS, Arm, FailureKind, JobState
from test_evidence import HOSTILE, _outside_fences, ab_job, matrix_job

URL = "http://lab.example:7420/jobs/job-1"


def xml_of(job: JobView) -> ET.Element:
    return ET.fromstring(junit.job_junit(job, abstats.analyse(job.spec, job.runs, job.cells), URL))


def plain_job(*statuses: int, state=JobState.DONE, not_run: str | None = None) -> JobView:
    spec = JobSpec(title="boots", run=["./boot-test"], rounds=max(1, len(statuses)))
    runs = [RunRecord(seq=i, arm=Arm.RUN, started_at=1.7e9 + i, ended_at=1.7e9 + i + 0.5, status=status,
                      output_tail=f"tail {i}") for i, status in enumerate(statuses)]
    cells = [CellReport(cell=0, device=None if not_run else "sim-board-0", not_run=not_run)]
    return JobView(id="job-1", owner="ann", kind="interactive", state=state, reason="" if state is JobState.DONE
                   else "interrupted (Ctrl-C)", spec=spec, created_at=1.7e9, cells=cells, runs=runs)


def results(root: ET.Element) -> dict[str, str]:
    """Each testcase's name and what it says: passed, failure:TYPE, error:TYPE."""
    said = {}
    for case in root.iter("testcase"):
        found = [f"{child.tag}:{child.get('type')}" for child in case if child.tag in ("failure", "error", "skipped")]
        said[f"{case.get('classname')}/{case.get('name')}"] = found[0] if found else "passed"
    return said


def test_a_slower_patch_is_a_failure_and_a_faster_one_passes_with_its_words():
    slower, faster = xml_of(ab_job(factor=1.05)), xml_of(ab_job(factor=0.95))
    assert results(slower) == {"SIMD decode/runs": "passed", "SIMD decode/workload_ms": "failure:regressed"}
    assert "slower" in slower.find(".//testcase[@name='workload_ms']/failure").get("message")
    assert results(faster) == {"SIMD decode/runs": "passed", "SIMD decode/workload_ms": "passed"}
    assert "faster" in faster.find(".//testcase[@name='workload_ms']/system-out").text
    assert (slower.get("tests"), slower.get("failures"), slower.get("errors")) == ("2", "1", "0")


def test_an_unknown_verdict_passes_with_its_words():
    job = ab_job(factor=1.0)
    job = job.model_copy(update={"runs": [r for r in job.runs if r.seq < 6]})   # 2 + 2 counted: undecided
    root = xml_of(job)
    case = root.find(".//testcase[@name='workload_ms']")
    assert results(root)["SIMD decode/workload_ms"] == "passed"
    assert case.find("system-out").text.startswith("unknown: collect more")


def test_the_device_fingerprint_and_the_job_page_are_properties():
    properties = {p.get("name"): p.get("value") for p in xml_of(ab_job()).iter("property")}
    assert properties["device"] == "board-1" and properties["device.isa"] == "fp asimd sve2"
    assert properties["job.url"] == URL and properties["lease"] == "L1"
    assert properties["device.fact.board.rev"] == "B|3 <i>"


def test_a_test_failure_a_lab_failure_and_a_cell_not_run():
    assert results(xml_of(plain_job(0, 1, 0))) == {"boots/boots": "failure:test"}
    assert results(xml_of(plain_job(0, LAB_FAILURE_STATUS))) == {"boots/boots": "error:lab"}
    # a test's failure is what the reader must see, whatever else failed
    assert results(xml_of(plain_job(LAB_FAILURE_STATUS, 2))) == {"boots/boots": "failure:test"}
    said = results(xml_of(plain_job(not_run="no device of class sim within 5m")))
    assert said == {"boots/boots": "error:lab"}
    failure = xml_of(plain_job(0, 1)).find(".//failure")
    assert "1 of 2 runs failed" in failure.get("message") and "tail 1" in failure.text


def test_a_retried_cell_reads_its_last_attempt_and_names_the_ones_before():
    job = plain_job(0, 0)
    first = RunRecord(seq=0, arm=Arm.RUN, attempt=0, started_at=1.7e9, ended_at=1.7e9 + 1, status=1,
                      failure=FailureKind.LAB, output_tail="console gone")
    retried = [r.model_copy(update={"attempt": 1}) for r in job.runs]
    cells = [CellReport(cell=0, attempt=0, device="sim-board-0", failure=FailureKind.LAB, reason="sim-board-0 went "
                        "offline"), CellReport(cell=0, attempt=1, device="sim-board-1")]
    root = xml_of(job.model_copy(update={"cells": cells, "runs": [first, *retried]}))
    assert results(root) == {"boots/boots": "passed"}
    assert "attempt 0 on sim-board-0: lab failure: sim-board-0 went offline" in root.find("testsuite/system-out").text
    assert {p.get("name"): p.get("value") for p in root.iter("property")}["device"] == "sim-board-1"
    # the last attempt the lab ended with no failed run to show it, and a run past its deadline
    lost = [CellReport(cell=0, device="sim-board-0", failure=FailureKind.LAB, reason="its lease was revoked")]
    assert results(xml_of(job.model_copy(update={"cells": lost}))) == {"boots/boots": "error:lab"}
    late = job.runs[0].model_copy(update={"status": -9, "failure": FailureKind.TIMEOUT})
    root = xml_of(job.model_copy(update={"runs": [late]}))
    assert results(root) == {"boots/boots": "failure:timeout"} and "deadline" in root.find(".//failure").get("message")


def test_a_job_that_did_not_complete_is_an_error_of_its_own():
    root = xml_of(plain_job(0, state=JobState.CANCELLED))
    assert results(root)["boots/job"] == "error:job-cancelled"
    assert "interrupted (Ctrl-C)" in root.find(".//testcase[@name='job']/error").get("message")


def test_a_matrix_is_a_suite_per_cell_named_by_its_group_not_its_device():
    root = xml_of(matrix_job())
    suites = [s.get("name") for s in root.iter("testsuite")]
    assert suites == ["matrix [tags=sve2]", "matrix [tags=rvv]", "matrix [tags=avx2]"]
    assert results(root)["matrix.tags=avx2/tags=avx2"] == "error:lab"    # the cell that never ran


def test_hostile_text_still_makes_xml():
    job = ab_job(title=HOSTILE + "\x00\x07\ufffe", device=HOSTILE)
    text = junit.job_junit(job, abstats.analyse(job.spec, job.runs, job.cells), URL)
    root = ET.fromstring(text)                   # (it parses: no character XML 1.0 refuses)
    assert "\x1b" not in text and "\x00" not in text
    assert root.get("name").startswith("evil|dev")
    assert junit.xml_text("x" * 5000).endswith("…") and len(junit.xml_text("x" * 5000)) == junit.MAX_ATTRIBUTE_CHARS


def outcome(status: int, failure: FailureKind | None = None, cancelled: str | None = None,
            reason: str | None = None) -> CommandOutcome:
    return CommandOutcome(command=("./test.sh", "--board", HOSTILE), status=status, failure=failure,
                          cancelled=cancelled, reason=reason, device="sim-board-0", lease="lease-1", started_at=1.7e9,
                          timings=Timings(wait_s=1, run_s=2.5, total_s=4))


WITH_OUTCOMES = {"passed": outcome(0), "failure:test": outcome(3, FailureKind.TEST, reason="the command exited 3"),
                 "error:lab": outcome(LAB_FAILURE_STATUS, FailureKind.LAB, reason="the lease was lost: revoked"),
                 "failure:timeout": outcome(124, FailureKind.TIMEOUT, reason="--max-time 1s cut the command"),
                 "error:cancelled": outcome(130, cancelled="SIGINT", reason="cancelled by SIGINT")}


@pytest.mark.parametrize("said", WITH_OUTCOMES)
def test_a_with_is_one_testcase_named_by_its_command(said):
    done = WITH_OUTCOMES[said]
    device = {"name": "sim-board-0", "class": "sim-board", "host": "lab-1", "tags": ["rvv"], "fidelity": "simulated",
              "facts": {"board.rev": "B"}}
    root = ET.fromstring(junit.command_junit(done, device))
    (case,) = root.iter("testcase")
    assert results(root) == {f"device-loop with/{case.get('name')}": said}
    assert case.get("name").startswith("./test.sh --board") and case.get("time") == "2.500"
    properties = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert properties["device.fact.board.rev"] == "B" and properties["lease"] == "lease-1"
    text = command_markdown(done)
    assert re.search(rf"\| exit status +\| {done.status} ", text)
    assert "\x1b" not in text and "<script>" not in _outside_fences(text)    # the command line, fenced


def test_every_document_keeps_to_the_jenkins_junit_schema():  # (./lab test, --fast too, fetched the schema)
    import xmlschema

    from junit_schema import validator

    schema = validator()
    jobs = [ab_job(factor=1.05), ab_job(title=HOSTILE + "\x00", device=HOSTILE), matrix_job(),
            plain_job(0, 1, LAB_FAILURE_STATUS), plain_job(not_run="no device"), plain_job(0, state=JobState.FAILED)]
    for job in jobs:
        schema.validate(junit.job_junit(job, abstats.analyse(job.spec, job.runs, job.cells), URL))
    for done in WITH_OUTCOMES.values():
        schema.validate(junit.command_junit(done))
    # the schema has teeth: what its parsers would not read, it refuses
    with pytest.raises(xmlschema.XMLSchemaValidationError):
        schema.validate('<testsuites><testsuite name="x" tests="1" failures="0" errors="0">'
                        '<error message="misplaced"/></testsuite></testsuites>')


def test_a_junit_schema_not_prepared_fails_the_test_saying_to_run_lab_test(tmp_path, monkeypatch):
    import prepare
    from junit_schema import validator

    monkeypatch.setattr(prepare, "FOLDER", tmp_path)
    with pytest.raises(pytest.fail.Exception, match=r"not prepared: the JUnit schema .*\./lab test fetches"):
        validator()
    assert list(tmp_path.iterdir()) == [], "nothing is fetched inside pytest"


@pytest.mark.parametrize("args, said", [
    (["--junit", "."], "is a folder"), (["--markdown", "/no/such/folder/x.md"], "there is no folder"),
    (["--junit", "same", "--markdown", "same"], "name the same file")])
def test_report_files_are_checked_before_anything_runs(args, said, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from device_loop.cli.jobs import ab_command

    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(ab_command, ["--baseline", "a", "--patch", "b", *args], obj={"coordinator": "http://127.0.0.1:9", "user": "ann"})
    assert done.exit_code == 2 and said in done.output, done.output
