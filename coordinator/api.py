"""The REST routes: each call of ``calls.CALLS`` that has one, and the few routes that answer
something other than JSON (the board's event stream, metrics, this API's description, the
web page). A route parses what the call takes, asks the call, and answers JSON."""
from __future__ import annotations

import functools
import json
import re
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import Route

from device_loop.core import API_PREFIX, TOKEN_IGNORED_HEADER
from device_loop.core.errors import ErrorCode

from . import openapi
from .answer_json import answer_bytes
from .calls import CALLS, Call, Ctx
from .errors import APIError, bad_request
from .identity import ANYONE, caller_identity, check_access
from .idempotency import MAX_KEY_CHARS, idempotently
from .limits import body_of, check_media_type, takes_body
from .rules import Rules
from .schemas import MAX_WAIT_S
from .scope_check import check_scope
from .web import pages

# PostgreSQL's text holds no NUL character (SQLite's does): it is refused on both, before
# the store sees it. In JSON it can only come escaped: a backslash (after an even number
# of them) and u0000.
ESCAPED_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def _rules(request: Request) -> Rules:
    return request.app.state.rules


def _refuse_nul(body: bytes) -> None:
    if b"\\u0000" in body and ESCAPED_NUL.search(body):  # the search alone: 14 ms for a 1000-device heartbeat
        raise APIError(422, ErrorCode.INVALID, "text may not contain the NUL character (\\u0000)")


def _problems(errors: list) -> APIError:
    return APIError(422, ErrorCode.INVALID, "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: "
                                                      f"{e['msg'].removeprefix('Value error, ')}" for e in errors))


async def _model_body(request: Request, model: type[BaseModel]) -> BaseModel:
    """A body that is a model of its own (a heartbeat), parsed by pydantic itself: a
    1000-device heartbeat in a few milliseconds."""
    body = await request.body() or b"{}"
    _refuse_nul(body)
    try:
        return model.model_validate_json(body, strict=True)  # a number is not true or "60"
    except ValidationError as exc:
        errors = exc.errors()
    if any(e["type"] == "json_invalid" for e in errors):
        raise bad_request("request body is not valid JSON")
    if any(e["type"] == "int_type" and isinstance(e["input"], float) for e in errors):
        try:  # 626.0 is an integer to JSON Schema, as to the OpenAPI document: read it as 626
            # (JSON's rules, not Python's: a state is its text, not an enum's member)
            return model.model_validate_json(json.dumps(json.loads(body, parse_float=_integral)), strict=True)
        except ValidationError as exc:
            errors = exc.errors()
    raise _problems(errors)


async def _json_object(request: Request) -> dict[str, Any]:
    """A JSON body, as an object (an empty body is ``{}``); numbers that are whole are ints
    (626.0 is an integer to JSON Schema, as to the OpenAPI document)."""
    body = await request.body() or b"{}"
    _refuse_nul(body)
    try:
        data = json.loads(body, parse_float=_integral)
    except (ValueError, RecursionError):  # (a body nested a thousand deep is no request either)
        raise bad_request("request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise APIError(422, ErrorCode.INVALID, "body: the request body is a JSON object")
    return data


def _integral(text: str) -> float | int:
    """A JSON number with a fraction or exponent, as an int if it is a whole number."""
    number = float(text)
    return int(number) if number.is_integer() else number


def path_names(call: Call) -> set[str]:
    return set(re.findall(r"\{(\w+)", call.path or ""))


async def _args(call: Call, request: Request) -> BaseModel:
    """What ``call`` takes, from the path, and the query (a GET) or the JSON body (a POST):
    the body parsed strictly (a number is not true or "60"), the URL's text as text."""
    values: dict[str, Any] = dict(request.path_params)
    if call.method == "GET" or call.body is not None or call.streamed:
        values |= {k: v for k, v in request.query_params.items()}
        strict = False
    else:
        body = await _json_object(request)
        inside = sorted(set(body) & path_names(call))
        if inside:
            raise APIError(422, ErrorCode.INVALID, f"{', '.join(inside)}: given in the path, not in the body")
        values |= body
        strict = True
    known = {field.alias or name for name, field in call.args.model_fields.items()} | set(call.args.model_fields)
    if not strict:  # a query parameter the call does not take is ignored, as before
        values = {k: v for k, v in values.items() if k in known}
    try:
        if strict:  # JSON's rules, not Python's: a state is its text, not an enum's member
            return call.args.model_validate_json(json.dumps(values), strict=True)
        return call.args.model_validate(values)
    except ValidationError as exc:
        errors = exc.errors()
    if not strict and not call.streamed:  # a bad query parameter is a malformed URL (an upload's: what it takes)
        raise bad_request("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))
    raise _problems(errors)


def _hung_up(request: Request):
    """For a long-poll: a function that returns once the caller has hung up."""
    async def hung_up() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    return hung_up


class _ImageFile(FileResponse):
    chunk_size = 1 << 20  # Starlette's 64 KiB: 16,384 sends a GiB


def route_handler(call: Call):
    """The Starlette handler of ``call``."""
    async def handle(request: Request) -> Response:
        body = await _model_body(request, call.body) if call.body is not None else None
        args = await _args(call, request)
        ctx = Ctx(_rules(request), await caller_identity(request), _hung_up(request), MAX_WAIT_S, body,
                  stream=request.stream() if call.streamed else None)
        check_scope(ctx.caller, call.operation(args))

        async def act() -> Response:
            return await _response(call, ctx, await call.run(ctx, args))

        if not call.idempotent:
            return _told(request, await _response(call, ctx, await call.carry_out(ctx, args)))
        ready = call.ready
        return _told(request, await idempotently(request, ctx.caller.name, act,
                                                 None if ready is None else functools.partial(ready, ctx, args)))

    handle.__name__ = handle.__qualname__ = call.name
    handle.__doc__ = call.doc
    marked: Any = handle  # (what the access test reads: the call a handler serves)
    marked.call = call
    if call.streamed:  # bytes, streamed; the run bounds them (the registry: --max-image-size)
        handle = takes_body(max_bytes=None, media_type=None)(handle)
    elif call.body is not None:
        handle = takes_body(call.max_body)(handle)
    return handle


def _told(request: Request, response: Response) -> Response:
    """``response``, saying that the token its request carried was not used, in the trust mode."""
    if request.app.state.single_user and "authorization" in request.headers:
        response.headers[TOKEN_IGNORED_HEADER] = "the trust mode: every local caller is the lab's owner"
    return response


async def _response(call: Call, ctx: Ctx, answer: Any) -> Response:
    if call.answer is bytes:  # a file of the registry, streamed
        return _ImageFile(answer, media_type="application/octet-stream")
    if call.media_type is not None:  # text to read as it is (a job's evidence markdown)
        return Response(answer, status_code=call.status, media_type=call.media_type,
                        headers={"Cache-Control": "no-store"})
    # an answer is rendered on the event loop while it is small, the rest in a thread, so that
    # /health and every other request are served meanwhile (docs/architecture.md, "Shares of one lab")
    return Response(await answer_bytes(answer), status_code=ctx.status or call.status,
                    media_type="application/json")


@openapi.answers("text/event-stream")
async def events(request: Request) -> Response:
    """Server-sent events: a ``snapshot`` of every device, then each ``device`` that changed
    (``?html=1``: with its board row)."""
    if "text/event-stream" not in request.headers.get("accept", ""):  # a plain GET would never end
        raise APIError(406, ErrorCode.NOT_ACCEPTABLE, "this is a stream of server-sent events: send "
                                                      "'Accept: text/event-stream'")
    stream = request.app.state.events.stream(html=request.query_params.get("html") == "1")
    return StreamingResponse(stream, media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


@openapi.answers("text/plain")
async def metrics(request: Request) -> Response:
    """Prometheus metrics: the lab as the database has it, and what this process counted."""
    life = _rules(request).life
    return Response(await life.metrics.exposition(life.clock()), media_type=life.metrics.content_type)


@openapi.answers("application/json")
async def openapi_json(request: Request) -> Response:
    """This API's OpenAPI description (this lab's: its longest lease, its trust mode)."""
    document = _openapi_document(_rules(request).settings.max_ttl_s, request.app.state.single_user)
    return Response(document, media_type="application/json")


@functools.cache
def _openapi_document(max_ttl_s: float, single_user: bool) -> bytes:
    return json.dumps(openapi.document(CALLS, MAX_WAIT_S, MAX_KEY_CHARS, max_ttl_s, single_user)).encode()


# The route table: every route, and who may call it. Only the ANYONE rows take callers
# without a token (tests/test_access.py calls every route to hold this table to it).
ROUTES: list[tuple[str, str, str, Any]] = [
    *[(call.method or "", call.route, call.access, route_handler(call)) for call in CALLS if call.path is not None],
    ("GET", API_PREFIX + "/openapi.json", ANYONE, openapi_json),
    ("GET", API_PREFIX + "/events", ANYONE, events),  # the board's changes, as they happen
    ("GET", "/metrics", ANYONE, metrics),
    # the web page (README "Web page and metrics"): what it changes goes through the routes above
    ("GET", "/", ANYONE, pages.board),
    ("GET", "/devices/{name}", ANYONE, pages.device_page),
    ("POST", "/login", ANYONE, pages.login),
    ("POST", "/logout", ANYONE, pages.logout),
    ("GET", "/static/{file}", ANYONE, pages.static_file),
]


def _guarded(access: str, handler):
    @functools.wraps(handler)
    async def guard(request: Request) -> Response:
        check_access(access, await caller_identity(request), request.path_params.get("name"))
        if any("\x00" in text for text in [*request.path_params.values(), *request.query_params.keys(),
                                          *request.query_params.values()]):
            raise bad_request("the URL has a NUL character (%00)")
        check_media_type(body_of(handler), request.method, request.headers)
        return await handler(request)
    return guard


routes = [Route(path, _guarded(access, handler), methods=[method]) for method, path, access, handler in ROUTES]
