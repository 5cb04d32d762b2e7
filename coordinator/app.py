"""The coordinator's Starlette app: routes, error handlers, the reaper, the database."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
from pathlib import Path
from typing import Any, Callable, Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.middleware import Middleware
from starlette.routing import Match, Route

from device_loop.core.errors import ErrorCode

from .api import routes
from .errors import APIError, database_unavailable
from .agents import LazyAgents
from .events import Broadcaster
from .limits import BODY_GAP_S, BoundedBodies
from .notify import CallerGone
from .origin import KnownOrigins, allowed_hosts as known_hosts
from .rules import Rules, Settings
from .store import DatabaseUnavailable, Store
from .web import job_pages
from .web.pages import device_row, queue_row

log = logging.getLogger(__name__)

# The jobs' web pages, beside api.ROUTES (who may see each is its handler's to check, as the
# other pages')
JOB_ROUTES = [*job_pages.routes]


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(exc.to_json(), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    code = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}.get(exc.status_code, ErrorCode.HTTP_ERROR)
    headers = exc.headers
    if exc.status_code == 405:  # Starlette's Allow names the first route of the path; a path has a route a method
        matching = [route for route in request.app.router.routes if isinstance(route, Route)
                    and route.matches(request.scope)[0] != Match.NONE]
        # the methods of the path that matched first (/jobs/claim is not also /jobs/{job_id})
        methods = {m for route in matching if route.path == matching[0].path for m in route.methods or ()}
        headers = {**(headers or {}), "Allow": ", ".join(sorted(methods))}
    return JSONResponse({"error": code, "message": f"{request.method} {request.url.path}: {exc.detail}"},
                        status_code=exc.status_code, headers=headers)


async def _database_unavailable(request: Request, exc: DatabaseUnavailable) -> JSONResponse:
    return await _api_error(request, database_unavailable(exc))  # (the store logged the outage, once)


async def _hung_up(request: Request, exc: CallerGone) -> Response:
    return Response(status_code=499)  # nobody reads it: the caller hung up (nginx's code for that)


async def _crash(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return JSONResponse({"error": ErrorCode.INTERNAL,
                         "message": "the coordinator hit an unexpected error; see its log"}, status_code=500)


async def _reaper(rules: Rules, stopping: asyncio.Event) -> None:
    """Reap every ``reaper_interval_s`` until ``stopping``; a pass is never cut in half. The
    first pass, and the first after the database was lost, begins with ``rules.back()``."""
    away = True  # (this process just began serving: nobody could reach it before)
    while not stopping.is_set():
        try:
            if away:
                await rules.back()
                away = False
            await rules.reap()
        except DatabaseUnavailable:
            away = True  # the store logged the outage, once; the next pass reaps what this one could not
        except Exception:
            log.exception("reaper pass failed; retrying")
        rules.reap_passes += 1
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stopping.wait(), rules.settings.reaper_interval_s)


def create_app(database_url: str, settings: Settings | None = None, single_user: bool = False,
               allowed_hosts: Sequence[str] = (), tailnet_socket: str | None = None,
               tailnet_admins: Sequence[str] = (), body_gap_s: float = BODY_GAP_S) -> Starlette:
    """A coordinator on ``database_url`` (``sqlite:///PATH`` or ``postgresql://...``).

    ``single_user``: the trust mode of ``device-loop up`` on loopback: no tokens, every
    caller is who it says it is and may call every route. ``allowed_hosts``: the Host
    headers (``name`` or ``name:port``) clients and agents reach this coordinator by,
    besides loopback; others get 421.
    ``tailnet_socket``: tailscaled's LocalAPI socket, to know callers without a token by
    their tailnet login (``tailnet_admins`` are admins). ``body_gap_s``: the longest a
    request body may pause before the request is cut (408).
    """
    store = Store(database_url)
    settings = settings or Settings()
    if settings.image_dir is None and store.dialect == "sqlite" and ":memory:" not in database_url:
        # images beside the database, unless told otherwise (--image-dir)
        settings = dataclasses.replace(settings, image_dir=str(Path(database_url.split("sqlite:///", 1)[1]).parent
                                                              / "images"))
    # the data-plane gate goes with authentication: off exactly in the trust mode
    rules = Rules(store, dataclasses.replace(settings, gated=not single_user))
    events = Broadcaster(rules.devices.list_devices, rules.life.notifier, render_row=device_row)  # one a process
    events.follow_queue(lambda: rules.scheduler.queue(), queue_row)  # the board shows the queue too
    state = {"rules": rules, "single_user": single_user, "tailnet_socket": tailnet_socket,
             "tailnet_admins": set(tailnet_admins), "events": events}
    agents = LazyAgents(rules, list(allowed_hosts), state)
    log.info("every route (REST and /mcp) answers these Host headers, others get 421: %s",
             ", ".join(known_hosts(list(allowed_hosts))))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        await store.connect()
        # What is loaded by now lives as long as the process: keep it out of the cyclic
        # collector's full passes, which otherwise stall a request for tens of milliseconds.
        gc.freeze()
        stopping = asyncio.Event()
        rules.life.serving_since = rules.life.clock()
        reaper = asyncio.create_task(_reaper(rules, stopping))
        log.info("coordinator ready on %s", store.dialect)
        try:
            yield
        finally:
            stopping.set()
            await events.close()
            await agents.close()
            await reaper
            await store.disconnect()

    # (each handler takes its own exception class, which Starlette's type cannot say)
    handlers: dict[Any, Callable[..., Any]] = {APIError: _api_error, HTTPException: _http_error,
                                               CallerGone: _hung_up, DatabaseUnavailable: _database_unavailable,
                                               Exception: _crash}
    app = Starlette(
        # /mcp is stateless: no GET event stream
        routes=[*routes, *JOB_ROUTES, Route("/mcp", endpoint=agents, methods=["POST"])],
        middleware=[Middleware(KnownOrigins, allowed=list(allowed_hosts)),
                    Middleware(BoundedBodies, gap_s=body_gap_s)],
        lifespan=lifespan,
        exception_handlers=handlers,
    )
    for key, value in state.items():  # caller_identity reads these from the app it is asked by
        setattr(app.state, key, value)
    if tailnet_socket:
        log.info("tailnet identities from %s; admins: %s", tailnet_socket, ", ".join(tailnet_admins) or "none")
    return app
