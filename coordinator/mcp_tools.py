"""The MCP route for agents (docs/architecture.md "Identity"): the calls of ``calls.CALLS``
marked as tools, with the same rules as REST.

Streamable HTTP, stateless (any coordinator process can answer), JSON answers. A tool's
arguments are its call's model's fields, with their descriptions (all an agent reads); it
asks ``caller_identity`` who calls, exactly as a REST route does, and every refusal is a
``ToolError`` whose message an agent can act on, with the code REST answers with.
"""
from __future__ import annotations

import asyncio
import enum
import inspect
import typing
from typing import Annotated, Any

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel, Field, ValidationError

from device_loop.core import __version__
from device_loop.core.errors import ErrorCode

from .answer_json import LARGE_ANSWER, cut_to
from .calls import TOOLS, Call, Ctx
from .errors import APIError, database_unavailable
from .identity import caller_identity, check_access
from .jobs import runs_cursor
from .origin import allowed_hosts
from .scope_check import check_scope
from .store import DatabaseUnavailable
from .who import Who

TOOL_MAX_WAIT_S = 30.0  # a tool's long-poll: an agent's call never hangs for long
TOOL_ANSWER = LARGE_ANSWER  # bytes a tool answers at most (about: a list keeps at least one item)


async def _never_hangs_up() -> None:
    """A tool's wait is bounded by its own ``wait_s``; the SDK ends the call if the agent goes."""
    await asyncio.get_running_loop().create_future()


async def _who(ctx: Context, access: str) -> Who:
    """The caller, if it may call a tool of ``access``."""
    try:
        request = ctx.request_context.request
        assert request is not None  # (streamable HTTP: every call is a request)
        identity = await caller_identity(request)
        check_access(access, identity)
    except DatabaseUnavailable as exc:
        raise _refusal(database_unavailable(exc)) from None
    except APIError as exc:
        if exc.code == ErrorCode.UNAUTHENTICATED:  # an agent has no token file: say what it sends
            raise ToolError("this needs a token: send it as the HTTP header 'Authorization: Bearer TOKEN' "
                            "(ask a lab admin for one)") from None
        raise ToolError(exc.message) from None
    return identity


def _refusal(exc: APIError) -> ToolError:
    """A refusal as a tool's error, with the code REST answers with, for agents that branch on it."""
    return ToolError(f"{exc.message} [{exc.code}]")


def _enum_of(annotation: Any) -> type[enum.Enum] | None:
    """The enum ``annotation`` is (or is optionally), if it is one."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, enum.Enum):
            return candidate
    return None


def _as_sent(annotation: Any) -> Any:
    """What the SDK checks a tool's argument against: an enum as the text it is sent as, and
    a model (a job's spec) as the object it is sent as, so that what is wrong with it reaches
    the call's own model, whose refusal says it in words an agent acts on (the SDK's would be
    a pydantic dump)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return dict[str, Any]
    if _enum_of(annotation) is None:
        return annotation
    return str | None if type(None) in typing.get_args(annotation) else str


def _inlined(schema: Any, definitions: dict[str, Any]) -> Any:
    """``schema`` with each reference to ``definitions`` replaced by what it names (a tool's
    parameter is a schema of its own: it has no ``$defs`` to point into)."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            return _inlined(definitions[schema["$ref"].rsplit("/", 1)[1]], definitions)
        return {k: _inlined(v, definitions) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inlined(v, definitions) for v in schema]
    return schema


def _choices(annotation: Any) -> dict | None:
    """What the argument's schema says besides its type: an enum's choices, a model's fields."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        schema = annotation.model_json_schema(by_alias=True)
        return {k: v for k, v in _inlined(schema, schema.get("$defs", {})).items() if k not in ("title",
                                                                                                 "description")}
    choices = _enum_of(annotation)
    return {"enum": [member.value for member in choices]} if choices else None


def _tool(rules, call: Call):
    """``call`` as a tool function: its signature is the call's arguments (``inspect``)."""
    async def tool(ctx: Context, **kwargs: Any) -> Any:
        caller = await _who(ctx, call.access)
        try:
            args = call.args.model_validate(kwargs)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ToolError(f"{'.'.join(map(str, first['loc']))}: {first['msg']} [invalid]") from None
        try:
            check_scope(caller, call.operation(args))
            answer = await call.carry_out(Ctx(rules, caller, _never_hangs_up, TOOL_MAX_WAIT_S, via_tool=True), args)
            if isinstance(answer, bytes):
                return Image(data=answer, format="jpeg")
            return await _within_bound(call, answer)
        except APIError as exc:
            raise _refusal(exc) from None
        except DatabaseUnavailable as exc:  # (REST answers it 503 with Retry-After)
            raise _refusal(database_unavailable(exc)) from None

    parameters = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Context)]
    for name, field in call.args.model_fields.items():
        default = inspect.Parameter.empty if field.is_required() else field.get_default(call_default_factory=True)
        annotation: Any = Annotated[_as_sent(field.annotation), Field(description=field.description or "",
                                                                 json_schema_extra=_choices(field.annotation))]
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                            annotation=annotation))
    returns = Image if call.answer is bytes else str if call.answer is str else dict[str, Any]
    tool.__signature__ = inspect.Signature(parameters, return_annotation=returns)  # type: ignore[attr-defined]
    tool.__name__ = call.name
    return tool


async def _within_bound(call: Call, answer: Any) -> Any:
    """A tool's answer cut to ``TOOL_ANSWER`` bytes (the SDK renders it on the event loop, and an
    agent reads it whole): a job's runs up to a cursor where ``job_runs`` goes on, a list's first
    items with how many were left off (docs/architecture.md, "Shares of one lab")."""
    shown = await cut_to(answer, TOOL_ANSWER, runs_cursor)
    if not call.tool_key:
        return shown
    if len(shown) == len(answer):
        return {call.tool_key: shown}
    return {call.tool_key: shown, "left_off": len(answer) - len(shown),
            "why": f"a tool answers at most {TOOL_ANSWER >> 10} KiB: narrow what you ask for"}


def build_mcp(rules) -> MCPServer:
    server = MCPServer("device-loop", version=__version__, instructions=(
        "Reserve lab devices by name or by class and tags, wait until their endpoints are up, talk to them, give "
        "them back. reserve never blocks: poll lease_status (wait_s) until ready; with queue=true it may answer a "
        "ticket instead: follow it with claim_ticket (wait_s) until it holds a lease (ticket_status only reads "
        "it). Release what you no longer need."))
    for call in TOOLS:
        tool = _tool(rules, call)
        for name in (call.name, *call.aliases):
            server.add_tool(tool, name=name, description=call.doc if name == call.name else
                            f"{call.doc} (the same as {call.name})")
    return server


def mcp_app(rules, extra_hosts: list[str]):
    """(the Starlette app serving /mcp, its session manager: run it in the parent's lifespan)."""
    server = build_mcp(rules)
    hosts = allowed_hosts(extra_hosts)
    origins = [f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")]
    app = server.streamable_http_app(
        streamable_http_path="/mcp", stateless_http=True, json_response=True,
        transport_security=TransportSecuritySettings(allowed_hosts=hosts, allowed_origins=origins))
    return app, server.session_manager
