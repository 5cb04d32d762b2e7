"""REST routes under /api/v1: parse, ask ``rules``, answer JSON. Nothing else."""
from __future__ import annotations

import functools
import hashlib
import json

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from device_loop.core import LEASE_PREFIX, PROTOCOL_VERSION, __version__
from device_loop.core.protocol import Heartbeat

from .errors import APIError, bad_request
from .identity import ADMIN, ANYONE, EXPORTER, USER, caller_identity, check_access, issue_token, token_view
from .rules import Rules
from .schemas import AdoptIn, CollectIn, DrainIn, FlashIn, KnownGoodIn, RenewIn, ReserveIn, RetireIn, TokenIn
from .store import UniqueViolation

MAX_WAIT_S = 60.0


def _rules(request: Request) -> Rules:
    return request.app.state.rules


async def _body(request: Request, model: type[BaseModel]) -> BaseModel:
    try:  # pydantic parses the JSON itself: a 1000-device heartbeat in a few milliseconds
        return model.model_validate_json(await request.body() or b"{}")
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise bad_request("request body is not valid JSON") from None
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg'].removeprefix('Value error, ')}"
                             for e in exc.errors())
        raise APIError(422, "invalid", problems) from None


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
        if len(key) > 200:
            raise bad_request("Idempotency-Key is longer than 200 characters")
        rules, caller = _rules(request), (await caller_identity(request)).name
        fingerprint = hashlib.sha256(
            request.method.encode() + request.url.path.encode() + await request.body()).hexdigest()

        def record(response: Response) -> dict:
            return {"caller": caller, "key": key, "request": fingerprint, "status": response.status_code,
                    "body": _without_secret(response.body), "created_at": rules.clock()}

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
        return Response(await _with_secret(rules, seen["body"]), status_code=seen["status"],
                        media_type="application/json")

    return wrapper


def _without_secret(body: bytes) -> str:
    """A stored answer keeps no lease secret: it outlives the lease (a day), the secret must not."""
    answer = json.loads(body)
    if isinstance(answer, dict) and answer.get("secret"):
        answer["secret"] = None
        return json.dumps(answer)
    return body.decode()


async def _with_secret(rules: Rules, body: str) -> str:
    """A replayed lease answer, with its secret again while the lease lives (the first answer had it)."""
    answer = json.loads(body)
    if not (isinstance(answer, dict) and "secret" in answer and str(answer.get("id", "")).startswith(LEASE_PREFIX)):
        return body
    lease = await rules.store.lease(answer["id"])
    answer["secret"] = lease["secret"] if lease else None
    return json.dumps(answer)


async def health(request: Request) -> Response:
    return _json({"ok": True, "version": __version__, "protocol": PROTOCOL_VERSION})


async def list_devices(request: Request) -> Response:
    return _json(await _rules(request).list_devices())


async def device_info(request: Request) -> Response:
    return _json(await _rules(request).device_info(request.path_params["name"]))


async def device_log(request: Request) -> Response:
    return _json(await _rules(request).device_log(request.path_params["name"]))


async def list_hosts(request: Request) -> Response:
    return _json(await _rules(request).hosts())


async def heartbeat(request: Request) -> Response:
    report = await _body(request, Heartbeat)
    actor = f"exporter:{request.path_params['name']}"
    return _json(await _rules(request).heartbeat(request.path_params["name"], report, actor))


async def _caller(request: Request):
    return await caller_identity(request)


async def desired(request: Request) -> Response:
    etag = request.query_params.get("etag")
    rules, name = _rules(request), request.path_params["name"]
    return _json(await rules.wait_desired(name, etag, _wait_s(request), request.is_disconnected))


@idempotent
async def reserve(request: Request) -> Response:
    body = await _body(request, ReserveIn)
    caller = await _caller(request)
    return _json(await _rules(request).reserve(body.device, body.ttl_s, caller.name, caller.admin), 201)


async def my_leases(request: Request) -> Response:
    device = request.query_params.get("device")
    return _json(await _rules(request).my_leases((await _caller(request)).name, device))


async def lease_status(request: Request) -> Response:
    rules, caller = _rules(request), await _caller(request)
    lease_id = request.path_params["lease_id"]
    unless = request.query_params.get("unless")
    return _json(await rules.wait_lease(lease_id, caller.name, unless, _wait_s(request), request.is_disconnected,
                                        caller.admin))


@idempotent
async def renew(request: Request) -> Response:
    body = await _body(request, RenewIn)
    rules, caller = _rules(request), await _caller(request)
    return _json(await rules.renew(request.path_params["lease_id"], body.ttl_s, caller.name, caller.admin))


@idempotent
async def release(request: Request) -> Response:
    rules, caller = _rules(request), await _caller(request)
    return _json(await rules.release(request.path_params["lease_id"], caller.name, caller.admin))


@idempotent
async def create_token(request: Request) -> Response:
    body = await _body(request, TokenIn)
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
async def retire_device(request: Request) -> Response:
    body = await _body(request, RetireIn)
    rules, caller = _rules(request), await _caller(request)
    return _json(await rules.retire(request.path_params["device"], caller.name, body.retired, body.force))


@idempotent
async def drain_host(request: Request) -> Response:
    body = await _body(request, DrainIn)
    rules, caller = _rules(request), await _caller(request)
    return _json(await rules.drain(request.path_params["host"], caller.name, body.draining))


async def list_candidates(request: Request) -> Response:
    return _json(await _rules(request).candidates())


@idempotent
async def adopt_candidate(request: Request) -> Response:
    body = await _body(request, AdoptIn)
    rules, caller = _rules(request), await _caller(request)
    return _json(await rules.adopt(request.path_params["identifier"], body.name, body.device_class, body.tags,
                                   caller.name), 201)


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
async def mark_image_good(request: Request) -> Response:
    body = await _body(request, KnownGoodIn)
    caller = await _caller(request)
    return _json(await _rules(request).mark_good(request.path_params["ref"], body.target, caller.name))


@idempotent
async def collect_images(request: Request) -> Response:
    body = await _body(request, CollectIn)
    return _json(await _rules(request).collect_images(body.unused_days, (await _caller(request)).name))


@idempotent
async def flash(request: Request) -> Response:
    body = await _body(request, FlashIn)
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
    rules, unless = _rules(request), request.query_params.get("unless")
    return _json(await rules.wait_op(request.path_params["op_id"], unless, _wait_s(request), request.is_disconnected))


async def device_flashes(request: Request) -> Response:
    return _json(await _rules(request).flashes_of(request.path_params["name"]))


class _ImageFile(FileResponse):
    chunk_size = 1 << 20  # Starlette's 64 KiB: 16,384 sends a GiB


async def image_content(request: Request) -> Response:
    """An image's bytes, for the exporter of a host where a flash writes it."""
    path = await _rules(request).image_for_host(request.path_params["name"], request.path_params["sha256"])
    return _ImageFile(path, media_type="application/octet-stream")


async def audit_log(request: Request) -> Response:
    return _json(await _rules(request).audit())


# The route table: every route, and who may call it. Only the ANYONE rows take callers
# without a token (tests/test_access.py calls every route to hold this table to it).
ROUTES = [
    ("GET", "/api/v1/health", ANYONE, health),
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
    ("GET", "/api/v1/admin/audit", ADMIN, audit_log),
    ("GET", "/api/v1/admin/candidates", ADMIN, list_candidates),
    ("POST", "/api/v1/admin/candidates/{identifier:path}/adopt", ADMIN, adopt_candidate),
    ("POST", "/api/v1/admin/images/{ref}/known-good", ADMIN, mark_image_good),
    ("POST", "/api/v1/admin/images/gc", ADMIN, collect_images),
]


def _guarded(access: str, handler):
    @functools.wraps(handler)
    async def guard(request: Request) -> Response:
        check_access(access, await caller_identity(request), request.path_params.get("name"))
        return await handler(request)
    return guard


routes = [Route(path, _guarded(access, handler), methods=[method]) for method, path, access, handler in ROUTES]
