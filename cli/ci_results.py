"""Results where CI shows them (docs/architecture.md, "Results where CI shows them"): the
``--junit FILE`` and ``--markdown FILE`` options of ``run``, ``ab``, ``matrix``, ``job
evidence`` and ``with``, and the evidence appended to ``$GITHUB_STEP_SUMMARY`` when a step
of GitHub Actions sets it.

The paths are checked before anything runs (a CI job should not learn at its end, after a
board's half hour, that its report cannot be written); the files are written however the
command ended, a cancel included, since a cancelled job's partial results are what CI shows.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import click

STEP_SUMMARY = "GITHUB_STEP_SUMMARY"
#: Below this much room left in a step's summary, only a line with the link is written.
LEAST_SUMMARY_BYTES = 4096


def _writable(ctx, param, value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value)
    if path.is_dir():
        raise click.BadParameter(f"{value} is a folder: give a file's path")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise click.BadParameter(f"there is no folder {folder} to write {path.name} into")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise click.BadParameter(f"{value} cannot be written (permissions)")
    return path


def ci_options(command: Callable) -> Callable:
    """``--junit FILE`` and ``--markdown FILE``."""
    command = click.option("--markdown", "markdown_file", metavar="FILE", callback=_writable,
                           help="also write the evidence fit for a pull-request comment (under 65,536 characters: "
                                "long tables cut, with a link to the job's page)")(command)
    return click.option("--junit", "junit_file", metavar="FILE", callback=_writable,
                        help="also write the results as JUnit XML, for CI (GitLab, Jenkins, GitHub test "
                             "reporters)")(command)


def check_distinct(junit_file: Path | None, markdown_file: Path | None) -> None:
    """Refuse one file for both reports."""
    if junit_file is not None and markdown_file is not None and junit_file.resolve() == markdown_file.resolve():
        raise click.UsageError("--junit and --markdown name the same file: give each its own")


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc.strerror or exc}") from None


def _append_to_summary(text_for_room: Callable[[int], str]) -> None:
    """Append ``text_for_room(room)`` (``room``: the bytes a step summary has left) to the file
    ``$GITHUB_STEP_SUMMARY`` names, when set, after a blank line; a summary that cannot be
    written is said on stderr, not fatal (the results are in the job and its other files)."""
    from device_loop.core.ab.comment import STEP_SUMMARY_BYTES

    where = os.environ.get(STEP_SUMMARY, "")
    if not where:
        return
    path = Path(where)
    try:
        used = path.stat().st_size if path.exists() else 0
        text = text_for_room(STEP_SUMMARY_BYTES - used - 2)
        with path.open("a+b") as summary:
            summary.seek(max(0, used - 2))
            tail = summary.read(2)  # (a blank line before the text: a heading glued to a line is none)
            gap = "" if not used or tail.endswith(b"\n\n") else "\n" if tail.endswith(b"\n") else "\n\n"
            summary.write((gap + text.rstrip("\n") + "\n").encode())
    except OSError as exc:
        click.echo(f"device-loop: cannot append to ${STEP_SUMMARY} ({where}): {exc.strerror or exc}", err=True)


def append_step_summary(markdown: str, job_url: str, job_id: str) -> None:
    """Append a job's evidence ``markdown`` to the step summary (when there is one), cut to
    what it has room for: below ``LEAST_SUMMARY_BYTES``, only the link to the job's page."""
    from device_loop.core.ab.comment import fit, page_link

    _append_to_summary(lambda room: fit(markdown, room, job_url, job_id) if room >= LEAST_SUMMARY_BYTES else
                       f"The evidence is on {page_link(job_url, job_id)}.\n")


def job_page(lab_url: str, job_id: str) -> str:
    """The address of a job's page on the coordinator: the whole of its evidence."""
    import urllib.parse

    return f"{lab_url.rstrip('/')}/jobs/{urllib.parse.quote(job_id, safe='')}"


def write_job_results(lab_url: str, job, junit_file: Path | None, markdown_file: Path | None,
                      markdown: str | None = None) -> None:
    """A job's JUnit XML and comment-sized markdown to the files asked for, and its evidence
    to the step summary when there is one. ``markdown``: the evidence as the coordinator
    made it (else made here from the same runs: the same text)."""
    if junit_file is None and markdown_file is None and not os.environ.get(STEP_SUMMARY):
        return
    from device_loop.core.ab import abstats, evidence, junit
    from device_loop.core.ab.comment import PR_COMMENT_BYTES, fit

    analysis = abstats.analyse(job.spec, job.runs, job.cells)
    url = job_page(lab_url, job.id)
    if junit_file is not None:
        _write(junit_file, junit.job_junit(job, analysis, url))
    whole = markdown if markdown is not None else evidence.markdown(job, analysis)
    if markdown_file is not None:
        _write(markdown_file, fit(whole, PR_COMMENT_BYTES, url, job.id))
    append_step_summary(whole, url, job.id)


def _device_record(lab, name: str):
    """The coordinator's record of a device, or None when it does not answer within a few
    seconds (a lab failure may be the coordinator gone: the report must not wait for it)."""
    import urllib.parse

    from device_loop.client.http import Coordinator, CoordinatorError

    api = None
    try:
        api = Coordinator(lab.api.url, lab.api.user, timeout=3.0, retries=1)
        return api.get(f"/devices/{urllib.parse.quote(name, safe='')}")
    except CoordinatorError:
        return None
    finally:
        if api is not None:
            api.close()


def prepare_command_results(junit_file: Path | None, markdown_file: Path | None) -> None:
    """Load what writes a ``with``'s reports before its command runs, when it will write any: a
    cancel then costs no import (a runner's SIGKILL follows its SIGTERM by 2.5 s on GitHub)."""
    if junit_file is not None or markdown_file is not None or os.environ.get(STEP_SUMMARY):
        from device_loop.core.ab import comment, junit  # noqa: F401


def write_command_results(lab, outcome, junit_file: Path | None, markdown_file: Path | None) -> None:
    """A ``with``'s JUnit XML and markdown to the files asked for, and its markdown to the step
    summary when there is one. The device's record (its class, host, facts) is asked of the
    coordinator for the XML's properties: a coordinator that does not answer leaves only its name."""
    if junit_file is None and markdown_file is None and not os.environ.get(STEP_SUMMARY):
        return
    from device_loop.core.ab import junit
    from device_loop.core.ab.comment import command_markdown

    if junit_file is not None:
        device = _device_record(lab, outcome.device) if outcome.device else None
        _write(junit_file, junit.command_junit(outcome, device))
    markdown = command_markdown(outcome)
    if markdown_file is not None:
        _write(markdown_file, markdown)
    # (a with's markdown is short; a summary with no room for it gets its first line, the verdict)
    _append_to_summary(lambda room: markdown if len(markdown.encode()) + 1 <= room else markdown.splitlines()[0])
