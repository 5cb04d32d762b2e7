"""The one check of a scoped token's call against its scope (docs/architecture.md, "Shares of
one lab"): REST routes and MCP tools ask it right after a call's arguments are read, before
anything runs, with the operation the call's row of the calls table names.

What a lease may take (classes, tags, leases at once, its length, the budget) is judged
where the lease is granted, not here: this is the operations a token may run.
"""
from __future__ import annotations

from device_loop.core.errors import ErrorCode
from device_loop.core.scopes import TokenScope, allows

from .errors import APIError
from .who import Who


def allowed_operations(scope: TokenScope) -> str:
    """What ``scope`` lets its token run, in words."""
    return ", ".join(scope.operations) if scope.operations else "no operation"


def scope_refusal(who: Who, operation: str | None) -> APIError | None:
    """Why ``who`` may not run ``operation`` (None: a call that needs none), or None if it may."""
    scope = who.scope
    if operation is None or scope is None or allows(scope, operation):
        return None
    return APIError(403, ErrorCode.OUT_OF_SCOPE,
                    f"scope: this token may run {allowed_operations(scope)}; not {operation[:64]}")


def check_scope(who: Who, operation: str | None) -> None:
    """Refuse (403 ``out_of_scope``, naming the scope) unless ``who``'s scope lets it run ``operation``."""
    problem = scope_refusal(who, operation)
    if problem is not None:
        raise problem
