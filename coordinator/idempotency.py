"""Idempotency keys: a repeated ``Idempotency-Key`` from the same caller gets the first
answer again, and changes nothing (docs/architecture.md, "Speed, by design": looked up and
stored in the request's own transaction). A stored answer keeps no credential."""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from device_loop.core import LEASE_PREFIX
from device_loop.core.errors import ErrorCode
from device_loop.core.gate import gate_secret

from .errors import APIError, bad_request
from .rows import IdempotencyRow
from .rules import Rules
from .store import UniqueViolation

MAX_KEY_CHARS = 200  # of an Idempotency-Key


def _rules(request: Request) -> Rules:
    return request.app.state.rules


def _json(data, status: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status)


async def idempotently(request: Request, caller: str, act: Callable[[], Awaitable[Response]],
                       ready: Callable[[], Awaitable[None]] | None = None) -> Response:
    """``act()``'s answer, or, to a repeated ``Idempotency-Key`` from the same caller, the
    first answer again.

    The key is looked up, the request carried out and its answer stored in one
    transaction: a request that fails changes nothing, and of two concurrent requests
    with one key (in two coordinator processes) one commits and the other replays it.
    What the call waits for (``ready``, a long-poll) is awaited before that transaction
    begins, never inside it (docs/architecture.md, "Nothing that waits holds the lab").
    """
    key = request.headers.get("Idempotency-Key")
    if not key:
        if ready is not None:
            await ready()
        return await act()
    if len(key) > MAX_KEY_CHARS:
        raise bad_request(f"Idempotency-Key is longer than {MAX_KEY_CHARS} characters")
    rules = _rules(request)
    fingerprint = hashlib.sha256(
        request.method.encode() + request.url.path.encode() + await request.body()).hexdigest()

    def record(response: Response) -> IdempotencyRow:
        return {"caller": caller, "key": key, "request": fingerprint, "status": response.status_code,
                "body": _storable(bytes(response.body)), "created_at": rules.clock()}

    seen = await rules.idempotency_sql.idempotency_key(caller, key) if ready is not None else None
    if seen is None:
        try:
            if ready is not None:  # (a repeat replays at once, above: it does not wait again)
                await ready()
            async with rules.store.tx():
                seen = await rules.idempotency_sql.idempotency_key(caller, key)
                if seen is None:
                    response = await act()
                    await rules.idempotency_sql.save_idempotency_key(record(response))
        except APIError as exc:  # refused: nothing changed, and a repeat gets the same refusal ...
            if exc.status == 429:  # ... but "not yet" (a share's rate): the repeat, later, is tried afresh
                raise
            response = _json(exc.to_json(), exc.status)
            try:
                await rules.idempotency_sql.save_idempotency_key(record(response))
            except UniqueViolation:
                seen = await rules.idempotency_sql.idempotency_key(caller, key)
        except UniqueViolation:  # a concurrent request with this key committed first
            seen = await rules.idempotency_sql.idempotency_key(caller, key)
    if seen is None:
        return response
    if seen["request"] != fingerprint:
        raise APIError(422, ErrorCode.IDEMPOTENCY_KEY_REUSED, "this Idempotency-Key was used for a different request")
    return Response(await _replayed(rules, seen["body"]), status_code=seen["status"],
                    media_type="application/json")


# Credentials in an answer. A stored answer outlives them (a day), and a copy of the database
# must not give them away: they are taken out of it wherever they appear (a gate's secret is
# also in the capability URLs of its endpoints, and in the commands that use them). A gate's
# secret leaves a mark naming its part of the data plane, from which a replay derives it again.
SECRET_MARK = "<gate secret for {scope}>"
_MARKED = re.compile(r"<gate secret for ([a-z][a-z0-9._-]{0,63})>")
_SCOPE_WORD = re.compile(r"[a-z][a-z0-9._-]{0,63}")


def _endpoints(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The endpoints of the lease an answer is, or holds (a ticket's)."""
    lease = answer if isinstance(answer.get("endpoints"), list) else answer.get("lease")
    if not isinstance(lease, dict) or not isinstance(lease.get("endpoints"), list):
        return []
    return [e for e in lease["endpoints"] if isinstance(e, dict)]


def _storable(body: bytes) -> str:
    """An answer as it is stored for replays: without any credential."""
    text = body.decode()
    answer = json.loads(text)
    if isinstance(answer, dict):
        token = answer.get("token")
        if isinstance(token, str) and token:
            text = text.replace(token, "")
        for endpoint in _endpoints(answer):
            secret, scope = endpoint.get("secret"), str(endpoint.get("scope", ""))
            if isinstance(secret, str) and secret:
                text = text.replace(secret, SECRET_MARK.format(scope=scope) if _SCOPE_WORD.fullmatch(scope) else "")
    return text


def _lease_id(answer: dict[str, Any]) -> str | None:
    lease = answer if str(answer.get("id", "")).startswith(LEASE_PREFIX) else answer.get("lease")
    return str(lease["id"]) if isinstance(lease, dict) and str(lease.get("id", "")).startswith(LEASE_PREFIX) else None


async def _replayed(rules: Rules, body: str) -> str:
    """A stored answer, replayed: its gates' secrets back while the lease lives (the first
    answer had them; they end with the lease), and a token never (it was shown once: the
    answer says so)."""
    answer = json.loads(body)
    if not isinstance(answer, dict):
        return body
    lease_id = _lease_id(answer)
    if lease_id is not None and _MARKED.search(body):
        secret = await rules.leases.secret(lease_id)
        answer = json.loads(_MARKED.sub(lambda found: gate_secret(secret, found[1]) if secret else "", body))
        for endpoint in _endpoints(answer):
            endpoint["secret"] = endpoint.get("secret") or None
    if answer.get("token") == "":
        answer["token"] = None
        answer["note"] = (f"already done: token {answer.get('id')} was made by the first request with this "
                          "Idempotency-Key; its secret was shown then, once, and is kept nowhere")
    return json.dumps(answer)
