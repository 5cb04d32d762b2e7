"""The jobs' web pages (docs/architecture.md, "Jobs and evidence"): the signed-in person's
jobs, and a job's page (its state, cells, runs, the analysis, and a chart of each metric per
run). A job is shown to whoever may read it (its owner, its worker, admins); to anyone else
it does not exist, as through the REST routes. Everything shown is escaped by the templates
(the chart is ``core/ab/charts.py``'s SVG, which escapes what it writes itself).
"""
from __future__ import annotations

import re
from typing import Any

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from device_loop.core.ab.jobs import JobView
from device_loop.core.vocabulary import OPEN_JOB_STATES

from ..errors import APIError
from ..openapi import answers
from .pages import Viewer, render, viewer_of

JOB_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def _spread(summary: Any) -> str:
    """benchstat's ± of one arm: the median's interval's larger half, in %."""
    spread = getattr(summary, "spread_pct", None) if summary is not None else None
    return "±∞" if spread is None else f"±{spread:.1f}%"


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def analysis_rows(analysis: Any) -> list[dict[str, Any]]:
    """A row per cell and metric of ``core.ab.abstats.Analysis``, as the page's table shows it."""
    from device_loop.core.ab.evidence import delta_text  # (it loads scipy: only once a job page is asked for)

    rows = []
    for cell in getattr(analysis, "cells", ()):
        for metric in cell.metrics:
            comparison = metric.comparison
            rows.append({
                "cell": cell.cell, "group": cell.group, "device": cell.device, "metric": metric.name,
                "unit": metric.unit, "a": f"{_number(metric.a.median)} {_spread(metric.a)}",
                "b": f"{_number(metric.b.median)} {_spread(metric.b)}" if metric.b is not None else "",
                # the measured change with its interval, as the evidence gives it, then what it means
                # ("B is 9.5% faster", or for an unknown verdict how many rounds more would decide it)
                "delta": delta_text(comparison, metric.unit) if comparison is not None else "",
                "words": comparison.words if comparison is not None else "",
                "p": f"{comparison.p_holm:.3g}" if comparison is not None else "",
                "verdict": str(comparison.verdict) if comparison is not None else "",
                "n": f"{metric.a.n}" + (f"+{metric.b.n}" if metric.b is not None else ""),
                "warnings": [*cell.warnings, *metric.warnings], "unfit": cell.unfit,
            })
    return rows


SHOWN_LINES = 3  # of each run's output on its page (escaped by the template; the whole tail: the API)


def run_rows(job: JobView) -> tuple[list[str], list[dict[str, Any]]]:
    """The job's metrics (as its runs report them), and a row per run."""
    metrics = list(dict.fromkeys([m.name for m in job.spec.metrics] + [s.metric for r in job.runs for s in r.samples]))
    rows = []
    for run in job.runs:
        values = {s.metric: s.value for s in run.samples}
        temperatures = run.readings.temperatures
        rows.append({"cell": run.cell, "attempt": run.attempt, "seq": run.seq, "arm": str(run.arm),
                     "warmup": run.warmup, "failure": run.failure.value if run.failure else "",
                     "started_at": run.started_at, "seconds": run.ended_at - run.started_at, "status": run.status,
                     "temperature": max(temperatures.values()) if temperatures else None,
                     "governor": run.readings.governor, "unfit": run.readings.unfit,
                     "values": [_number(values.get(m)) if m in values else "" for m in metrics],
                     "output": "\n".join(run.last_lines(SHOWN_LINES))})
    return metrics, rows


def _chart(job: JobView, analysis: Any) -> Markup | None:
    """Each metric per run, A and B in two colours, the temperature beside (``core/ab/charts.py``)."""
    if not job.runs:
        return None
    try:
        from device_loop.core.ab import charts
    except ImportError:
        return None
    return Markup(charts.svg(job, analysis))  # (its SVG escapes every text it writes)


def _may_cancel(viewer: Viewer, job: JobView) -> bool:
    return job.state in OPEN_JOB_STATES and viewer.who.may_act_on(job.owner)


@answers("text/html")
async def jobs_page(request: Request) -> Response:
    """The viewer's jobs (an admin's ``?all=1``: everyone's), open ones first."""
    viewer = await viewer_of(request)
    everyone = viewer.admin and request.query_params.get("all") == "1"
    jobs = await request.app.state.rules.jobs.jobs(viewer.name, everyone) if viewer.name else []
    return render(request, "jobs.html", viewer, jobs=jobs, everyone=everyone)


@answers("text/html")
async def job_page(request: Request) -> Response:
    """A job: its state and reason, cells, runs, the analysis and a chart per metric."""
    viewer, job_id = await viewer_of(request), request.path_params["job_id"]
    if viewer.name is None or not JOB_ID.match(job_id):
        return render(request, "missing.html", viewer, 404, what="job", name=job_id[:64])
    try:
        job, analysis = await request.app.state.rules.jobs.analysed(job_id, viewer.who)
    except APIError as exc:
        if exc.status != 404:
            raise
        return render(request, "missing.html", viewer, 404, what="job", name=job_id)
    metrics, runs = run_rows(job)
    return render(request, "job.html", viewer, job=job, cells=job.cells, metrics=metrics, runs=runs,
                 analysis=analysis_rows(analysis), method=getattr(analysis, "method", ""),
                 chart=_chart(job, analysis), may_cancel=_may_cancel(viewer, job))


routes = [Route("/jobs", jobs_page, methods=["GET"]), Route("/jobs/{job_id}", job_page, methods=["GET"])]
