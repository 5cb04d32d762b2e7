"""The jobs' web pages: the signed-in person's jobs, and a job's page."""
from __future__ import annotations

from starlette.routing import Route

routes: list[Route] = []
