"""How to use a lease's endpoints, as their plugins said (``Endpoint.command`` and ``env``):
the one place the CLI and the MCP route fill the templates, and the one place that says
what a template may hold.

A template is data from an exporter, never a format string: its only fields are
``{name}`` with a name of ``TEMPLATE_FIELDS`` or a key of the endpoint's ``params``, and
``{{``/``}}`` for a brace. No attribute or index access, format spec or conversion.
``template_problem`` refuses anything else when an exporter reports it; ``fill`` never
fails, and leaves what it does not know as it is (rows stored before that check).
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

from .vocabulary import EndpointRole

#: An endpoint, and a lease, as the API answers them (JSON objects)
EndpointJSON = Mapping[str, Any]
LeaseJSON = Mapping[str, Any]

#: The fields every endpoint's templates may name, besides the keys of its ``params``.
TEMPLATE_FIELDS = ("host", "port", "url", "lease")
#: A template's pieces: an escaped brace, a ``{field}``, or a lone brace.
_PIECE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_BRACES = {"{{": "{", "}}": "}"}


def _fields(endpoint: EndpointJSON, lease_id: str) -> dict[str, str]:
    return {**{str(k): str(v) for k, v in (endpoint.get("params") or {}).items()},
            "host": str(endpoint.get("host", "")), "port": str(endpoint.get("port", "")),
            "url": str(endpoint.get("url") or ""), "lease": lease_id}


def fill(template: str, endpoint: EndpointJSON, lease_id: str) -> str:
    """``template`` with its fields replaced by the endpoint's values (a field it has no
    value for, or anything that is not a plain field, stays as it is)."""
    fields = _fields(endpoint, lease_id)

    def piece(match: re.Match) -> str:
        text = match.group(0)
        if text in _BRACES:
            return _BRACES[text]
        return fields.get(match.group(1), text) if match.group(1) is not None else text

    return _PIECE.sub(piece, template)


def template_problem(template: str, params_keys: Iterable[str]) -> str | None:
    """Why ``template`` is not one an endpoint may carry, or None."""
    known = (*TEMPLATE_FIELDS, *sorted(params_keys))
    for match in _PIECE.finditer(template):
        name = match.group(1)
        if match.group(0) in _BRACES:
            continue
        if name is None:
            return f"a lone {match.group(0)!r} at character {match.start() + 1}: write it twice for a brace"
        if name not in known:
            return (f"{{{name}}} is not a field: a template names only {', '.join(f'{{{k}}}' for k in known)} "
                    "(no attribute, index, format spec or conversion)")
    return None


def out_of_scope(lease: LeaseJSON, operation: str, what: str) -> str | None:
    """Why ``lease`` shows no ``what`` (its endpoints of scope ``operation``: uart, adb, camera,
    screen, ssh), when its reader's token's scope withholds it; None otherwise."""
    if operation not in (lease.get("withheld") or ()):
        return None
    return (f"{lease.get('device', 'the device')}'s {what} is not shown to this token: its scope does not name "
            f"{operation} (an admin adds it: device-loop admin token set TOKEN_ID --scope op=...,{operation})")


def gated(lease: LeaseJSON) -> bool:
    """Whether a lease's endpoints ask for their gates' secrets (a lab with tokens)."""
    return any(endpoint.get("secret") for endpoint in lease.get("endpoints") or ())


def commands(lease: LeaseJSON) -> list[str]:
    """Ready-to-run commands for a lease's endpoints (``device-loop forward`` first where the
    endpoints ask for their gates' secrets)."""
    out = [f"device-loop forward {lease['id']}"] if gated(lease) else []
    for endpoint in lease["endpoints"]:
        if endpoint.get("command"):
            out.append(fill(endpoint["command"], endpoint, lease["id"]))
    return list(dict.fromkeys(out))


#: The lease a job's command runs for, as JSON (its endpoints and their secrets), set by the worker:
#: ``device-loop exec $DEVICE_LOOP_LEASE`` uses it without asking the coordinator, so a shared
#: worker need not hand its own token to its users' commands.
LEASE_ANSWER_ENV = "DEVICE_LOOP_LEASE_ANSWER"


def environment(lease: LeaseJSON, endpoints: Sequence[EndpointJSON] | None = None) -> dict[str, str]:
    """The exports that point tools at a lease's endpoints (or at ``endpoints``, e.g. local
    forwards of them)."""
    env: dict[str, str] = {}
    for endpoint in endpoints if endpoints is not None else lease["endpoints"]:
        env |= {name: fill(value, endpoint, lease["id"]) for name, value in (endpoint.get("env") or {}).items()}
    return env


def by_role(lease: LeaseJSON, role: str) -> list[EndpointJSON]:
    """A lease's endpoints that serve ``role`` (an ``EndpointRole``), whatever plugin serves them."""
    return [endpoint for endpoint in lease["endpoints"] if endpoint.get("role") == role]


def camera_urls(lease: LeaseJSON) -> dict[str, str] | None:
    """The URLs of a lease's camera (its ``http-stream`` endpoint), or None without one:
    ``page`` (shows the stream), ``stream`` (MJPEG) and ``snapshot`` (a JPEG)."""
    endpoint = camera_endpoint(lease)
    if endpoint is None or not endpoint.get("url"):
        return None
    params = endpoint["params"]
    return {"page": endpoint["url"], "stream": endpoint["url"] + params["stream"],
            "snapshot": endpoint["url"] + params["snapshot"]}


def camera_endpoint(lease: LeaseJSON) -> EndpointJSON | None:
    """A lease's camera endpoint (``http-stream``), if it has one a client can use: with the
    ``stream`` and ``snapshot`` paths in its ``params``."""
    for endpoint in by_role(lease, EndpointRole.HTTP_STREAM):
        params = endpoint.get("params") or {}
        if all(isinstance(params.get(p), str) for p in ("stream", "snapshot")):
            return endpoint
    return None


def screen_url(lease: LeaseJSON) -> str | None:
    """The browser viewer of a lease's screen (its ``web-viewer`` endpoint), or None."""
    return next((e.get("url") for e in by_role(lease, EndpointRole.WEB_VIEWER)), None)
