"""A job's evidence (docs/architecture.md, "Jobs and evidence"): the markdown a reviewer
reads, made from the stored runs by ``core/ab/evidence.py`` with ``core/ab/abstats.py``'s analysis,
so whoever asks gets the same text from the same runs (the call ``job_evidence`` answers it
as ``text/markdown`` over REST, as text to an MCP tool).

Who may read it: whoever may read the job (its owner, its worker, admins). The markdown is
the artefact meant to be shared: it is pasted into a review, not linked to.
"""
from __future__ import annotations

import asyncio

from device_loop.core.errors import ErrorCode

from .errors import APIError
from .jobs import Jobs
from .who import Who


def _missing(what: str) -> APIError:
    return APIError(503, ErrorCode.NOT_INSTALLED, f"this coordinator has no {what} (device-loop's core/{what}.py): "
                                                  "upgrade it")


async def evidence_markdown(jobs: Jobs, job_id: str, who: Who) -> str:
    """The job's evidence markdown, if ``who`` may read the job (404 otherwise)."""
    try:
        from device_loop.core.ab import evidence
    except ImportError:
        raise _missing("evidence") from None
    job, analysis = await jobs.analysed(job_id, who)
    if analysis is None:
        raise _missing("abstats")
    return await asyncio.to_thread(evidence.markdown, job, analysis)
