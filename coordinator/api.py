"""REST routes under /api/v1: parse, ask ``rules``, answer JSON. Nothing else."""
from __future__ import annotations

import functools
import hashlib
import json
import re

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from device_loop.core import LEASE_PREFIX, PROTOCOL_VERSION, __version__
from device_loop.core.protocol import Heartbeat

from . import openapi
from .errors import APIError, bad_request
from .identity import (ADMIN, ANYONE, EXPORTER, USER, caller_identity, check_access, issue_token, refusal,
                       token_view)
from .limits import MAX_BODY_BYTES, body_of, check_media_type, takes_body
from .rules import Rules
from .schemas import (AdoptIn, CollectIn, DrainIn, FlashIn, ForgetIn, KnownGoodIn, RenewIn, ReserveIn, RetireIn,
                      TokenIn)
from .store import UniqueViolation
from .web import pages

MAX_WAIT_S = 60.0
MAX_KEY_CHARS = 200  # of an Idempotency-Key
# PostgreSQL's text holds no NUL character (SQLite's does): it is refused on both, before
# the store sees it. In JSON it can only come escaped: a backslash (after an even number
# of them) and u0000.
ESCAPED_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def _rules(request: Request) -> Rules:
    return request.app.state.rules


async def _body(request: Request, model: type[BaseModel]) -> BaseModel:
    body = await request.body() or b"{}"
    if b"\\u0000" in body and ESCAPED_NUL.search(body):  # the search alone: 14 ms for a 1000-device heartbeat
        raise APIError(422, "invalid", "text may not contain the NUL character (\\u0000)")
    try:  # pydantic parses the JSON itself: a 1000-device heartbeat in a few milliseconds
        return model.model_validate_json(body, strict=True)  # a number is not true or "60"
    except ValidationError as exc:
        errors = exc.errors()
    if any(e["type"] == "json_invalid" for e in errors):
        raise bad_request("request body is not valid JSON")
    if any(e["type"] == "int_type" and isinstance(e["input"], float) for e in errors):
        try:  # 626.0 is an integer to JSON Schema, as to the OpenAPI document: read it as 626
            return model.model_validate(json.loads(body, parse_float=_integral), strict=True)
        except ValidationError as exc:
            errors = exc.errors()
    problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg'].removeprefix('Value error, ')}"
                         for e in errors)
    raise APIError(422, "invalid", problems)


def _integral(text: str) -> float | int:
    """A JSON number with a fraction or exponent, as an int if it is a whole number."""
    number = float(text)
    return int(number) if number.is_integer() else number


def takes(model: type[BaseModel], max_bytes: int = MAX_BODY_BYTES):
    """The handler is called as ``handler(request, body)``, with the JSON body (``max_bytes``
    at most) validated as ``model``; the OpenAPI document describes the body with the same model."""

    def decorate(handler):
        @functools.wraps(handler)
        async def parsed(request: Request) -> Response:
            return await handler(request, await _body(request, model))

        parsed.body_model = model
        return takes_body(max_bytes)(parsed)

    return decorate


def _wait_s(request: Request) -> float:
    try:
        wait = float(request.query_params.get("wait", "0"))
    except ValueError:
        raise bad_request("wait must be a number of seconds") from None
    if not 0 <= wait <= MAX_WAIT_S:
        raise bad_request(f"wait must be between 0 and {MAX_WAIT_S:g} seconds")
    return wait


def _json(data, status: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status)


def idempotent(handler):
    """Replay the first answer to a repeated ``Idempotency-Key`` from the same caller.

    The key is looked up, the request carried out and its answer stored in one
    transaction: a request that fails changes nothing, and of two concurrent requests
    with one key (in two coordinator processes) one commits and the other replays it.
    """

    @functools.wraps(handler)
    async def wrapper(request: Request) -> Response:
        key = request.headers.get("Idempotency-Key")
        if not key:
            return await handler(request)
        if len(key) > MAX_KEY_CHARS:
            raise bad_request(f"Idempotency-Key is longer than {MAX_KEY_CHARS} characters")
        rules, caller = _rules(request), (await caller_identity(request)).name
        fingerprint = hashlib.sha256(
            request.method.encode() + request.url.path.encode() + await request.body()).hexdigest()

        def record(response: Response) -> dict:
            return {"caller": caller, "key": key, "request": fingerprint, "status": response.status_code,
                    "body": _storable(response.body), "created_at": rules.clock()}

        try:
            async with rules.store.tx():
                seen = await rules.store.idempotency_key(caller, key)
                if seen is None:
                    response = await handler(request)
                    await rules.store.save_idempotency_key(record(response))
        except APIError as exc:  # refused: nothing changed, and a repeat gets the same refusal
            response = _json(exc.to_json(), exc.status)
            try:
                await rules.store.save_idempotency_key(record(response))
            except UniqueViolation:
                seen = await rules.store.idempotency_key(caller, key)
        except UniqueViolation:  # a concurrent request with this key committed first
            seen = await rules.store.idempotency_key(caller, key)
        if seen is None:
            return response
        if seen["request"] != fingerprint:
            raise APIError(422, "idempotency_key_reused", "this Idempotency-Key was used for a different request")
        return Response(await _replayed(rules, seen["body"]), status_code=seen["status"],
                        media_type="application/json")

    wrapper.idempotent = True  # the OpenAPI document lists its Idempotency-Key
    return wrapper


# Fields of an answer that are credentials. A stored answer outlives them (a day), and a copy
# of the database must not give them away: they are taken out of it wherever they appear (a
# lease's secret is also in the capability URLs of its endpoints).
CREDENTIALS = ("secret", "token")
SECRET_MARK = "<lease secret>"


def _storable(body: bytes) -> str:
    """An answer as it is stored for replays: without any credential."""
    text = body.decode()
    answer = json.loads(text)
    if isinstance(answer, dict):
        for field in CREDENTIALS:
            value = answer.get(field)
            if isinstance(value, str) and value:
                text = text.replace(value, SECRET_MARK if field == "secret" else "")
    return text


async def _replayed(rules: Rules, body: str) -> str:
    """A stored answer, replayed: a lease's secret back while the lease lives (the first answer
    had it; it ends with the lease), and a token never (it was shown once: the answer says so)."""
    answer = json.loads(body)
    if not isinstance(answer, dict):
        return body
    if str(answer.get("id", "")).startswith(LEASE_PREFIX) and SECRET_MARK in body:
        lease = await rules.store.lease(answer["id"])
        secret = lease["secret"] if lease else None
        answer = json.loads(body.replace(SECRET_MARK, secret or ""))
        answer["secret"] = secret
    if answer.get("token") == "":
        answer["token"] = None
        answer["note"] = (f"already done: token {answer.get('id')} was made by the first request with this "
                          "Idempotency-Key; its secret was shown then, once, and is kept nowhere")
    return json.dumps(answer)


async def health(request: Request) -> Response:
    return _json({"ok": True, "version": __version__, "protocol": PROTOCOL_VERSION})


async def list_devices(request: Request) -> Response:
    return _json(await _rules(request).list_devices())


async def device_info(request: Request) -> Response:
    admin = refusal(ADMIN, await _caller(request)) is None  # who may revoke the lease sees its id
    return _json(await _rules(request).device_info(request.path_params["name"], admin))


async def device_log(request: Request) -> Response:
    return _json(await _rules(request).device_log(request.path_params["name"]))


async def list_hosts(request: Request) -> Response:
    return _json(await _rules(request).hosts())


# a host of 1000 devices (the most a report has) with 4 resources each, their services and
# 1000 network finds is 2.3 MiB; the bound of every field (32 resources, 1000-character
# reasons) would allow 37 MiB, which no host sends
@takes(Heartbeat, max_bytes=8 << 20)
async def heartbeat(request: Request, report: Heartbeat) -> Response:
    actor = f"exporter:{request.path_params['name']}"
    return _json(await _rules(request).heartbeat(request.path_params["name"], report, actor))


async def _caller(request: Request):
    return await caller_identity(request)


def _hung_up(request: Request):
    """For a long-poll: a function that returns once the caller has hung up."""
    async def hung_up() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    return hung_up


async def desired(request: Request) -> Response:
    etag, boot_id = request.query_params.get("etag"), request.query_params.get("boot")
    rules, name = _rules(request), request.path_params["name"]
    return _json(await rules.wait_desired(name, etag, _wait_s(request), _hung_up(request), boot_id))


@idempotent
@takes(ReserveIn)
async def reserve(request: Request, body: ReserveIn) -> Response:
    caller = await _caller(request)
    return _json(await _rules(request).reserve(body.device, body.ttl_s, caller.name, caller.admin), 201)


async def my_leases(request: Request) -> Response:
    device = request.query_params.get("device")
    return _json(await _rules(request).my_leases((await _caller(request)).name, device))


async def lease_status(request: Request) -> Response:
    rules, caller = _rules(request), await _caller(request)
    lease_id = request.path_params["lease_id"]
    unless = request.query_params.get("unless")
    return _json(await rules.wait_lease(lease_id, caller.name, unless, _wait_s(request), _hung_up(request),
                                        caller.admin))


@idempotent
@takes(RenewIn)
async def renew(request: Request, body: RenewIn) -> Response:
    rules, caller = _rules(request), await _caller(request)
    return _json(await rules.renew(request.path_params["lease_id"], body.ttl_s, caller.name, caller.admin))


@idempotent
async def release(request: Request) -> Response:
    rules, caller = _rules(request), await _caller(request)
    return _json(await rules.release(request.path_params["lease_id"], caller.name, caller.admin))


@idempotent
@takes(TokenIn)
async def create_token(request: Request, body: TokenIn) -> Response:
    rules, caller = _rules(request), await _caller(request)
    made = await issue_token(rules.store, rules.clock, body.user, body.admin, body.exporter_host, body.expires_s)
    await rules.record(caller.name, "token_create", {k: made[k] for k in ("id", "user", "admin", "host")})
    return _json(made, 201)


async def list_tokens(request: Request) -> Response:
    return _json([token_view(row) for row in await _rules(request).store.tokens()])


@idempotent
async def revoke_token(request: Request) -> Response:
    rules = _rules(request)
    return _json(await rules.revoke_token(request.path_params["token_id"], (await _caller(request)).name))


@idempotent
async def revoke_lease(request: Request) -> Response:
    rules, caller = _rules(request), await _caller(request)
    return _json(await rules.revoke(request.path_params["lease_id"], caller.name))


@idempotent
@takes(RetireIn)
async def retire_device(request: Request, body: RetireIn) -> Response:
    rules, caller = _rules(request), await _caller(request)
    return _json(await rules.retire(request.path_params["device"], caller.name, body.retired, body.force))


@idempotent
@takes(DrainIn)
async def drain_host(request: Request, body: DrainIn) -> Response:
    rules, caller = _rules(request), await _caller(request)
    return _json(await rules.drain(request.path_params["host"], caller.name, body.draining))


@idempotent
@takes(ForgetIn)
async def forget(request: Request, body: ForgetIn) -> Response:
    """Delete an offline device nobody holds, or an offline host with its devices, for good
    (leases and the audit log keep their history)."""
    rules, caller = _rules(request), await _caller(request)
    return _json(await rules.forget(body.name, body.kind, caller.name))


async def list_candidates(request: Request) -> Response:
    return _json(await _rules(request).candidates())


@idempotent
@takes(AdoptIn)
async def adopt_candidate(request: Request, body: AdoptIn) -> Response:
    rules, caller = _rules(request), await _caller(request)
    return _json(await rules.adopt(request.path_params["identifier"], body.name, body.device_class, body.tags,
                                   caller.name), 201)


@takes_body(max_bytes=None, media_type=None)  # bytes, streamed; the registry bounds them (--max-image-size)
async def upload_image(request: Request) -> Response:
    """The body is the image, streamed; what it is comes in the query string (name, for,
    description; sha256 and size if the uploader knows them)."""
    query, caller = request.query_params, await _caller(request)
    try:
        size = int(query["size"]) if "size" in query else None
    except ValueError:
        raise bad_request("size must be a whole number of bytes") from None
    image, new = await _rules(request).upload(request.stream(), query.get("name", ""), query.get("for", ""),
                                              query.get("description", ""), query.get("sha256"), size, caller.name)
    return _json(image, 201 if new else 200)


async def list_images(request: Request) -> Response:
    return _json(await _rules(request).list_images(request.query_params.get("device")))


async def image_info(request: Request) -> Response:
    return _json(await _rules(request).image_info(request.path_params["ref"]))


@idempotent
async def remove_image(request: Request) -> Response:
    caller = await _caller(request)
    return _json(await _rules(request).remove_image(request.path_params["ref"], caller.name, caller.admin))


@idempotent
@takes(KnownGoodIn)
async def mark_image_good(request: Request, body: KnownGoodIn) -> Response:
    caller = await _caller(request)
    return _json(await _rules(request).mark_good(request.path_params["ref"], body.target, caller.name))


@idempotent
@takes(CollectIn)
async def collect_images(request: Request, body: CollectIn) -> Response:
    return _json(await _rules(request).collect_images(body.unused_days, (await _caller(request)).name))


@idempotent
@takes(FlashIn)
async def flash(request: Request, body: FlashIn) -> Response:
    caller = await _caller(request)
    return _json(await _rules(request).flash(request.path_params["lease_id"], body.image, caller.name, caller.admin),
                 201)


@idempotent
async def recover(request: Request) -> Response:
    caller = await _caller(request)
    return _json(await _rules(request).recover(request.path_params["lease_id"], caller.name, caller.admin), 201)


@idempotent
async def recover_unleased(request: Request) -> Response:
    rules, caller = _rules(request), await _caller(request)
    return _json(await rules.recover_unleased(request.path_params["device"], caller.name), 201)


async def flash_op(request: Request) -> Response:
    rules, unless, caller = _rules(request), request.query_params.get("unless"), await _caller(request)
    return _json(await rules.wait_op(request.path_params["op_id"], unless, _wait_s(request), _hung_up(request),
                                     caller=caller.name, admin=refusal(ADMIN, caller) is None))


async def device_flashes(request: Request) -> Response:
    caller = await _caller(request)  # a flash's lease is shown to its requester, its holder and admins
    return _json(await _rules(request).flashes_of(request.path_params["name"], caller=caller.name if caller.known
                                                  else None, admin=refusal(ADMIN, caller) is None))


class _ImageFile(FileResponse):
    chunk_size = 1 << 20  # Starlette's 64 KiB: 16,384 sends a GiB


async def image_content(request: Request) -> Response:
    """An image's bytes, for the exporter of a host where a flash writes it."""
    path = await _rules(request).image_for_host(request.path_params["name"], request.path_params["sha256"])
    return _ImageFile(path, media_type="application/octet-stream")


async def audit_log(request: Request) -> Response:
    return _json(await _rules(request).audit())


@openapi.answers("text/event-stream")
async def events(request: Request) -> Response:
    """Server-sent events: a ``snapshot`` of every device, then each ``device`` that changed
    (``?html=1``: with its board row)."""
    if "text/event-stream" not in request.headers.get("accept", ""):  # a plain GET would never end
        raise APIError(406, "not_acceptable", "this is a stream of server-sent events: send "
                                              "'Accept: text/event-stream'")
    stream = request.app.state.events.stream(html=request.query_params.get("html") == "1")
    return StreamingResponse(stream, media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


@openapi.answers("text/plain")
async def metrics(request: Request) -> Response:
    """Prometheus metrics: the lab as the database has it, and what this process counted."""
    rules = _rules(request)
    return Response(await rules.metrics.exposition(rules.store, rules.clock()), media_type=rules.metrics.content_type)


async def openapi_json(request: Request) -> Response:
    """This API's OpenAPI description (this lab's: its longest lease, its trust mode)."""
    document = _openapi_document(_rules(request).settings.max_ttl_s, request.app.state.single_user)
    return Response(document, media_type="application/json")


@functools.cache
def _openapi_document(max_ttl_s: float, single_user: bool) -> bytes:
    return json.dumps(openapi.document(ROUTES, MAX_WAIT_S, MAX_KEY_CHARS, max_ttl_s, single_user)).encode()


# The route table: every route, and who may call it. Only the ANYONE rows take callers
# without a token (tests/test_access.py calls every route to hold this table to it).
ROUTES = [
    ("GET", "/api/v1/health", ANYONE, health),
    ("GET", "/api/v1/openapi.json", ANYONE, openapi_json),
    ("GET", "/api/v1/devices", ANYONE, list_devices),  # the public board: who holds what, until when
    ("GET", "/api/v1/devices/{name}", ANYONE, device_info),
    ("GET", "/api/v1/devices/{name}/log", ANYONE, device_log),
    ("GET", "/api/v1/devices/{name}/flashes", ANYONE, device_flashes),
    ("GET", "/api/v1/hosts", ANYONE, list_hosts),
    ("POST", "/api/v1/hosts/{name}/heartbeat", EXPORTER, heartbeat),
    ("GET", "/api/v1/hosts/{name}/desired", EXPORTER, desired),
    ("GET", "/api/v1/hosts/{name}/images/{sha256}", EXPORTER, image_content),  # only images its flashes write
    ("POST", "/api/v1/leases", USER, reserve),
    ("GET", "/api/v1/leases", USER, my_leases),
    ("GET", "/api/v1/leases/{lease_id}", USER, lease_status),
    ("POST", "/api/v1/leases/{lease_id}/renew", USER, renew),
    ("POST", "/api/v1/leases/{lease_id}/release", USER, release),
    ("POST", "/api/v1/leases/{lease_id}/flash", USER, flash),  # its holder (or an admin)
    ("POST", "/api/v1/leases/{lease_id}/recover", USER, recover),
    ("GET", "/api/v1/ops/{op_id}", USER, flash_op),
    ("POST", "/api/v1/images", USER, upload_image),
    ("GET", "/api/v1/images", USER, list_images),
    ("GET", "/api/v1/images/{ref}", USER, image_info),
    ("POST", "/api/v1/images/{ref}/remove", USER, remove_image),  # its uploader, or an admin
    ("POST", "/api/v1/admin/tokens", ADMIN, create_token),
    ("GET", "/api/v1/admin/tokens", ADMIN, list_tokens),
    ("POST", "/api/v1/admin/tokens/{token_id}/revoke", ADMIN, revoke_token),
    ("POST", "/api/v1/admin/leases/{lease_id}/revoke", ADMIN, revoke_lease),
    ("POST", "/api/v1/admin/devices/{device}/retire", ADMIN, retire_device),
    ("POST", "/api/v1/admin/devices/{device}/recover", ADMIN, recover_unleased),
    ("POST", "/api/v1/admin/hosts/{host}/drain", ADMIN, drain_host),
    ("POST", "/api/v1/admin/forget", ADMIN, forget),  # a device or host that will not come back
    ("GET", "/api/v1/admin/audit", ADMIN, audit_log),
    ("GET", "/api/v1/admin/candidates", ADMIN, list_candidates),
    ("POST", "/api/v1/admin/candidates/{identifier:path}/adopt", ADMIN, adopt_candidate),
    ("POST", "/api/v1/admin/images/{ref}/known-good", ADMIN, mark_image_good),
    ("POST", "/api/v1/admin/images/gc", ADMIN, collect_images),
    ("GET", "/api/v1/events", ANYONE, events),  # the board's changes, as they happen
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
