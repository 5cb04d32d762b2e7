"""A job's evidence (docs/architecture.md, "Jobs and evidence"): the markdown a reviewer
reads, made from the stored runs by ``core/evidence.py`` with ``core/abstats.py``'s analysis,
so whoever asks gets the same text from the same runs; and its REST route, which answers
``text/markdown`` rather than JSON (the MCP tool ``job_evidence`` answers the same text).

Who may read it: whoever may read the job (its owner, its worker, admins). The markdown is
the artefact meant to be shared: it is pasted into a review, not linked to.
"""
from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from .errors import APIError, bad_request
from .identity import USER, caller_identity, check_access
from .jobs import Jobs
from .openapi import answers

MEDIA_TYPE = "text/markdown; charset=utf-8"


def _missing(what: str) -> APIError:
    return APIError(503, "not_installed", f"this coordinator has no {what} (device-loop's core/{what}.py): "
                                          "upgrade it")


async def evidence_markdown(jobs: Jobs, job_id: str, caller: str, admin: bool) -> str:
    """The job's evidence markdown, as ``caller`` may read it (404 otherwise)."""
    try:
        from device_loop.core import evidence
    except ImportError:
        raise _missing("evidence") from None
    job, analysis = await jobs.analysed(job_id, caller, admin)
    if analysis is None:
        raise _missing("abstats")
    return await asyncio.to_thread(evidence.markdown, job, analysis)


@answers("text/markdown")
async def evidence_route(request: Request) -> Response:
    """``GET /api/v1/jobs/{job_id}/evidence``: the job's evidence, as markdown."""
    identity = await caller_identity(request)
    check_access(USER, identity)
    job_id = request.path_params["job_id"]
    if "\x00" in job_id or len(job_id) > 64:
        raise bad_request("a job id has at most 64 characters, and no NUL")
    text = await evidence_markdown(request.app.state.rules.jobs, job_id, identity.name, identity.admin)
    return Response(text, media_type=MEDIA_TYPE, headers={"Cache-Control": "no-store"})
