"""What a scoped token's lease may take (docs/architecture.md, "Shares of one lab": "What a
lease may take is checked where it is granted"): the classes and tags it may reserve, and
the longest a lease may last. Pure rules on a ``TokenScope``; each refusal is 403
``out_of_scope``, naming the scope that refused and what it allows. The count of leases at
once and the budget are the database's (``budgets.py``)."""
from __future__ import annotations

from device_loop.core.durations import format_duration, iso
from device_loop.core.errors import ErrorCode
from device_loop.core.scopes import TokenScope

from .errors import APIError
from .rows import DeviceFacts


def out_of_scope(message: str) -> APIError:
    """403 ``out_of_scope``: ``message`` names the scope and what it allows."""
    return APIError(403, ErrorCode.OUT_OF_SCOPE, f"scope: {message}")


def _listed(names: tuple[str, ...]) -> str:
    return ", ".join(names)


def check_device(scope: TokenScope | None, device: DeviceFacts) -> None:
    """A reserve by name: ``device`` must be of one of the scope's classes and carry one of
    its tags."""
    if scope is None:
        return
    if scope.classes is not None and device["class"] not in scope.classes:
        raise out_of_scope(f"this token may reserve devices of class {_listed(scope.classes)}; not {device['name']} "
                           f"(class {device['class']})")
    if scope.tags is not None and not set(scope.tags) & set(device["tags"] or ()):
        raise out_of_scope(f"this token may reserve devices tagged {_listed(scope.tags)}; not {device['name']} "
                           f"(tags: {_listed(tuple(device['tags'] or ())) or 'none'})")


def narrowed(scope: TokenScope | None, device_class: str | None, tags: list[str]) -> tuple[str | None, list[str]]:
    """A reserve by class and tags as the scope narrows it: a class outside the scope is
    refused; a scope of one class (or one tag) names it when the request does not, so that a
    ticket waits only for what the token may take."""
    if scope is None:
        return device_class, tags
    if scope.classes is not None:
        if device_class is not None and device_class not in scope.classes:
            raise out_of_scope(f"this token may reserve devices of class {_listed(scope.classes)}; not class "
                               f"{device_class}")
        if device_class is None and len(scope.classes) == 1:
            device_class = scope.classes[0]
    if scope.tags is not None and not set(scope.tags) & set(tags) and len(scope.tags) == 1:
        tags = sorted({*tags, scope.tags[0]})
    return device_class, tags


def pick_within(scope: TokenScope | None, device_class: str | None,
                tags: list[str]) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
    """What a reserve by class must pick among besides its class and tags: (classes, tags any
    one of which it must have), None where the request already keeps within the scope."""
    if scope is None:
        return None, None
    classes = scope.classes if device_class is None else None
    any_tags = scope.tags if scope.tags is not None and not set(scope.tags) & set(tags) else None
    return classes, any_tags


def check_queueable(scope: TokenScope | None, device_class: str | None, tags: list[str]) -> None:
    """A ticket waits for what its request names: a token whose scope lists several classes
    (or tags) must name one of them to queue, or its ticket could be granted a device
    outside them."""
    classes, any_tags = pick_within(scope, device_class, tags)
    if classes is not None:
        raise out_of_scope(f"this token may reserve devices of class {_listed(classes)}: name one of them to queue")
    if any_tags is not None:
        raise out_of_scope(f"this token may reserve devices tagged {_listed(any_tags)}: name one of them to queue")


def bounded_ttl(scope: TokenScope | None, asked_s: float | None, ttl: float) -> float:
    """A new lease's ttl within the scope's longest lease: one asked for longer is refused,
    the lab's default (or a keepalive lease's maximum) cut to it."""
    longest = None if scope is None else scope.max_lease_s
    if longest is None or ttl <= longest:
        return ttl
    if asked_s is not None:
        raise out_of_scope(f"this token's leases last at most {format_duration(longest)} from their grant; not "
                           f"{format_duration(asked_s)}")
    return longest


def check_renewal(scope: TokenScope | None, granted_at: float, ends_at: float) -> None:
    """A renewal may not move a lease's end past the scope's longest lease, from its grant."""
    longest = None if scope is None else scope.max_lease_s
    if longest is not None and ends_at > granted_at + longest + 1e-6:
        raise out_of_scope(f"this token's leases last at most {format_duration(longest)} from their grant: this one "
                           f"until {iso(granted_at + longest)} at the latest")
