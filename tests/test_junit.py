"""JUnit XML of a job's results (core/ab/junit.py; docs/architecture.md, "Results where CI shows
them"): what becomes a failure, an error and a pass, the fingerprint as properties, text XML
cannot refuse, and every document held to the schema Jenkins and GitLab read."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from device_loop.core.ab import abstats, junit
from device_loop.core.ab.jobs import CellReport, JobSpec, JobView, RunRecord
from device_loop.core.vocabulary import LAB_FAILURE_STATUS, Arm, JobState
from test_evidence import HOSTILE, ab_job, matrix_job

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


@pytest.mark.service   # (it fetches the schema with pip, once per venv)
def test_every_document_keeps_to_the_jenkins_junit_schema():
    import xmlschema

    from junit_schema import validator

    schema = validator()
    jobs = [ab_job(factor=1.05), ab_job(title=HOSTILE + "\x00", device=HOSTILE), matrix_job(),
            plain_job(0, 1, LAB_FAILURE_STATUS), plain_job(not_run="no device"), plain_job(0, state=JobState.FAILED)]
    for job in jobs:
        schema.validate(junit.job_junit(job, abstats.analyse(job.spec, job.runs, job.cells), URL))
    # the schema has teeth: what its parsers would not read, it refuses
    with pytest.raises(xmlschema.XMLSchemaValidationError):
        schema.validate('<testsuites><testsuite name="x" tests="1" failures="0" errors="0">'
                        '<error message="misplaced"/></testsuite></testsuites>')
