"""Who is calling, and what they may call: the one place that decides
(docs/architecture.md, "Identity").

``caller_identity(request)`` answers for every route. Behind it: API tokens (random,
shown once, stored as SHA-256 hashes, with an owner, an optional expiry, and for
exporters the one host they may report for); where configured, the tailnet identity of
the peer (tailscaled's LocalAPI ``whois``) for callers without a token; or, in the explicit single-user trust
mode of ``device-loop up`` on loopback, whoever the caller says it is (who may then call
every route, admin ones included, and acts on another name's leases, tickets and jobs only
through them: docs/architecture.md, "Who may act on what"). What it answers is a ``Who``
(``who.py``).

A browser signed in on the web page sends its token in a cookie (HttpOnly, SameSite=Strict).
A cookie goes with every request to the coordinator, whoever made the page that sends it, so
a request it authenticates that changes anything must also carry ``X-Device-Loop-CSRF``,
a value made from the token that only the coordinator's own pages hold.
"""
from __future__ import annotations

import dataclasses
import functools
import getpass
import hashlib
import hmac
import json
import re
import secrets
from typing import Any, Callable

import httpx2
from pydantic import ValidationError
from starlette.requests import Request

from device_loop.core.durations import iso
from device_loop.core.scopes import TokenScope
from device_loop.core.vocabulary import Band, TokenKind

from device_loop.core.answers import TokenAnswer
from device_loop.core.errors import ErrorCode
from .errors import APIError
from .rows import TokenRow
from .who import ANONYMOUS, COORDINATOR, CallerKind, Who
from .store import Store
from .store.tokens import TokenQueries

USER_HEADER = "X-Device-Loop-User"
COOKIE = "device_loop_token"  # the web page's sign-in: the token itself
CSRF_HEADER = "X-Device-Loop-CSRF"
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
LAB_OWNER = getpass.getuser()  # the login the coordinator runs as
# no "@" in token names: tailnet logins have one, so the two never name the same person
USERNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# the names the coordinator itself acts under in the audit log and the ring logs (and
# "exporter:HOST", "database:LOGIN", which the pattern above cannot match): nobody is called so
RESERVED_NAMES = {COORDINATOR, ANONYMOUS.name}

# Who may call a route: a route names one of these in the route table (api.ROUTES).
ANYONE = "anyone"        # no token needed: health, the public board
USER = "user"            # any person's token (not an exporter's)
EXPORTER = "exporter"    # the token of the exporter whose host is in the path
ADMIN = "admin"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def csrf_token(token: str) -> str:
    """What a page signed in with ``token`` sends as ``X-Device-Loop-CSRF``."""
    return hashlib.sha256(f"csrf:{token}".encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """(token id, token): the id is public (lists, revocation); the token is shown once."""
    token_id = "tok-" + secrets.token_hex(4)
    return token_id, f"dl_{secrets.token_urlsafe(32)}"


def usable_name(name: str) -> bool:
    """Whether a person (or an exporter's host) may be called ``name``."""
    return bool(USERNAME.match(name)) and name.lower() not in RESERVED_NAMES


async def caller_identity(request: Request) -> Who:
    """The caller of ``request`` (computed once per request)."""
    if not hasattr(request.state, "identity"):
        request.state.identity = await _identify(request)
    return request.state.identity


async def _identify(request: Request) -> Who:
    app = request.app.state
    if app.single_user:
        # `device-loop up` on loopback: one person's lab, everyone local is trusted; who
        # does not say (an agent) is that person, as the CLI in their shell is
        said = request.headers.get(USER_HEADER, "").strip()
        if said and not usable_name(said):
            raise APIError(400, ErrorCode.BAD_USER, f"{USER_HEADER}: {said[:64]!r} is not a usable name (letters, "
                                                    f"digits, . _ -; 64 at most; not "
                                                    f"{', '.join(sorted(RESERVED_NAMES))})")
        return Who(said or LAB_OWNER, CallerKind.TRUSTED_LOCAL)
    header = request.headers.get("authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise APIError(401, ErrorCode.UNAUTHENTICATED, "send the token as 'Authorization: Bearer TOKEN'")
        identity = await token_identity(app.rules, token.strip())
        if identity is None:
            raise APIError(401, ErrorCode.BAD_TOKEN, "this token is unknown, revoked or expired")
        return identity
    cookie = request.cookies.get(COOKIE)
    # a cookie whose token died is no sign-in: the page shows its sign-in form again
    identity = await token_identity(app.rules, cookie) if cookie else None
    if cookie and identity is not None:
        csrf = csrf_token(cookie)
        missing = request.method not in SAFE_METHODS and not hmac.compare_digest(
            request.headers.get(CSRF_HEADER, "").encode(), csrf.encode())
        return dataclasses.replace(identity, csrf=csrf, csrf_missing=missing)
    return await _tailnet_identity(request) if app.tailnet_socket else ANONYMOUS


async def token_identity(rules, token: str) -> Who | None:
    """Whose ``token`` is, or None if it is unknown, revoked or expired."""
    row = await TokenQueries(rules.store).token_by_hash(hash_token(token))
    if row is None or row["revoked_at"] is not None or (row["expires_at"] or float("inf")) <= rules.clock():
        return None
    if row["host"]:
        return Who(f"exporter:{row['host']}", CallerKind.EXPORTER, host=row["host"])
    kind = CallerKind.AGENT if row["kind"] == TokenKind.AGENT else CallerKind.PERSON
    return Who(row["username"], kind, admin=row["admin"], token_id=row["id"], scope=scope_of(row["scope"]),
               band=Band(row["band"]))


def scope_of(text: str | None) -> TokenScope | None:
    """A token's scope as its row keeps it (JSON), parsed once per distinct scope: the check
    of every call costs the token's one lookup, which it made anyway (docs/architecture.md,
    "Shares of one lab"). A stored scope that no longer holds (a bound this version of the lab
    tightened) refuses its token's every call: 403 ``out_of_scope``, an admin sets it again."""
    if text is None:
        return None
    scope = parsed_scope(text)
    if scope is None:
        raise APIError(403, ErrorCode.OUT_OF_SCOPE, "scope: this token's scope, as stored, no longer holds in this "
                                                    "version of the lab: an admin sets it again (device-loop admin "
                                                    "token set TOKEN_ID --scope ..., or --unscoped)")
    return scope


@functools.lru_cache(maxsize=1024)
def parsed_scope(text: str) -> TokenScope | None:
    """``text`` as a scope, or None if it no longer validates."""
    try:
        return TokenScope.model_validate_json(text)
    except ValidationError:
        return None


def stored_scope(text: str | None) -> dict[str, Any] | None:
    """A token's scope as stored, whether or not it still validates (what an admin sees and
    changes: ``admin token ls``/``set``); None: unscoped."""
    if text is None:
        return None
    try:
        stored = json.loads(text)
    except ValueError:
        return {}
    return {k: v for k, v in stored.items() if v is not None} if isinstance(stored, dict) else {}


async def _tailnet_identity(request: Request) -> Who:
    """The tailnet user behind the peer address, from tailscaled's LocalAPI ``whois``.

    Only where the admin turned it on (``--tailnet-socket``): the peer address must be the
    tailnet's own, so never behind a proxy. Logins listed as admins (``--tailnet-admin``)
    are admins.
    """
    app, peer = request.app.state, request.client
    if peer is None:
        return ANONYMOUS
    transport = httpx2.AsyncHTTPTransport(uds=str(app.tailnet_socket))
    try:
        async with httpx2.AsyncClient(transport=transport, base_url="http://local-tailscaled.sock", timeout=3) as api:
            answer = await api.get("/localapi/v0/whois", params={"addr": f"{peer.host}:{peer.port}"})
        whois = answer.json() if answer.status_code == 200 else {}
        login = whois["UserProfile"]["LoginName"] if whois else None
        tagged = bool(whois and whois["Node"].get("Tags")) or login == "tagged-devices"
    except (httpx2.HTTPError, ValueError, KeyError, TypeError):
        login, tagged = None, False
    if not login or tagged:  # tagged nodes (servers, CI) all share one login: they are nobody
        return ANONYMOUS
    return Who(login, admin=login in app.tailnet_admins)


def check_access(access: str, identity: Who, host: str | None = None) -> None:
    """Refuse (401 without credentials, 403 with the wrong ones) unless ``identity`` may call."""
    problem = refusal(access, identity, host)
    if problem is not None:
        raise problem


def refusal(access: str, identity: Who, host: str | None = None) -> APIError | None:
    """Why ``identity`` may not call a route of ``access`` (for ``host``), or None if it may."""
    if access == ANYONE:  # signing in and out included: a cookie there is no credential
        return None
    if identity.csrf_missing:
        return APIError(403, ErrorCode.CSRF, f"a request signed in by the web page's cookie needs the page's "
                                             f"{CSRF_HEADER} header")
    if identity.admin or identity.trusted:
        return None
    if not identity.known:
        return APIError(401, ErrorCode.UNAUTHENTICATED, "this needs a token: set DEVICE_LOOP_TOKEN or write it to "
                                                        "~/.config/device-loop/token (ask a lab admin for one)")
    if access == USER and identity.host is None:
        return None
    if access == EXPORTER and identity.host is not None and identity.host == host:
        return None
    what = {USER: "a person's token", EXPORTER: f"the exporter token of host {host}", ADMIN: "an admin token"}
    return APIError(403, ErrorCode.FORBIDDEN, f"this needs {what[access]}; you are {identity.name}")


async def issue_token(store: Store, clock: Callable[[], float], username: str | None = None, admin: bool = False,
                      host: str | None = None, expires_s: float | None = None,
                      kind: TokenKind = TokenKind.PERSON, scope: TokenScope | None = None,
                      band: Band = Band.NORMAL) -> TokenAnswer:
    """A new token for a person (``username``; ``kind``: a person's or an agent's, whose
    queue tickets are batch) or an exporter (``host``); a person's may be scoped and banded
    (docs/architecture.md, "Shares of one lab": what needs the lab to judge, the caller judged
    first: ``Admin.judge_scope``). The answer holds the token itself, which is never shown again."""
    if username is not None and host is None:
        name = username
    elif host is not None and username is None:
        name = host
    else:
        raise APIError(422, ErrorCode.INVALID, "a token is for a person or for an exporter's host, not both")
    if not usable_name(name):
        raise APIError(422, ErrorCode.INVALID, f"{name!r} is not a usable name (letters, digits, . _ -; not "
                                               f"{', '.join(sorted(RESERVED_NAMES))}, which the lab's own actions use)")
    check_token_scope(admin, host, scope, band)
    token_id, token = new_token()
    now = clock()
    row: TokenRow = {"id": token_id, "hash": hash_token(token), "username": username or f"exporter:{host}",
                     "admin": bool(admin and host is None), "host": host, "kind": TokenKind(kind),
                     "scope": scope_text(scope), "band": Band(band), "created_at": now,
                     "expires_at": now + expires_s if expires_s else None, "revoked_at": None}
    await TokenQueries(store).insert_token(row)
    return {**token_view(row), "token": token}


def check_token_scope(admin: bool, host: str | None, scope: TokenScope | None, band: Band) -> None:
    """Refuse (422, the field named) a scope or a band on a token that takes none: a scope never
    makes an admin (an admin token is unscoped), and an exporter's token reports, it queues nothing."""
    if scope is not None and admin:
        raise APIError(422, ErrorCode.INVALID, "scope: an admin token is unscoped (a scope never makes an admin)")
    if host is not None and (scope is not None or band != Band.NORMAL):
        raise APIError(422, ErrorCode.INVALID, f"{'scope' if scope is not None else 'band'}: an exporter's token "
                                               "takes no scope or band")


def scope_text(scope: TokenScope | None) -> str | None:
    """A scope as the tokens table keeps it (JSON; None: unscoped)."""
    return None if scope is None else scope.model_dump_json()


def token_view(row: TokenRow) -> TokenAnswer:
    """A token as lists show it: everything but the secret and its hash."""
    scope = parsed_scope(row["scope"]) if row["scope"] is not None else None
    shown = stored_scope(row["scope"]) if scope is None else scope.model_dump(mode="json")
    return {"id": row["id"], "user": row["username"], "admin": bool(row["admin"]), "host": row["host"],
            "kind": row["kind"], "scope": shown, "band": row["band"],
            "created_at": iso(row["created_at"]), "expires_at": iso(row["expires_at"]),
            "revoked_at": iso(row["revoked_at"])}
