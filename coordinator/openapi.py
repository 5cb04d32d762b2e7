"""The OpenAPI 3.1 description of the REST API (``GET /api/v1/openapi.json``), made from
the calls' table (``calls.CALLS``): each call's arguments (its model: path, query and body
fields), its answer's type (``core/answers.py``) and who may make it. No wire shape is written
here a second time, only what the rules check beyond a model (``CHECKED``). Routes that do
not answer JSON (the web page, its files, metrics, the event stream) are not described."""
from __future__ import annotations

import copy
import re
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import models_json_schema

from device_loop.core import FLASH_KIND, LEASE_PREFIX, NAME_PATTERN, PROTOCOL_VERSION, __version__
from device_loop.core.errors import ErrorCode
from device_loop.core.protocol import MAX_TAG_CHARS
from device_loop.core.scopes import MAX_SCOPE_LEASE_S
from device_loop.core.vocabulary import Needs

from .identity import ANYONE, EXPORTER, RESERVED_NAMES, SAFE_METHODS, USER_HEADER, USERNAME
from .images import DIGEST_PREFIX, MIN_PREFIX_DIGITS

# PostgreSQL's text holds no NUL character: it is refused in every string (400 in the URL, 422 in a body)
NO_NUL = "^[^\\x00]*$"
TEXT, WHOLE = {"type": "string", "pattern": NO_NUL}, {"type": "integer", "minimum": 0}


def _none_of(words, end: str = "$") -> str:
    """A lookahead refusing ``words`` in any case (JSON Schema's patterns have no flags),
    followed by ``end``."""
    spelled = ["".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in w) for w in words]
    return f"(?!(?:{'|'.join(spelled)}){end})"


PERSON = {"type": "string", "pattern": "^" + _none_of(sorted(RESERVED_NAMES)) + USERNAME.pattern[1:]}
# X-Device-Loop-User: a person, or nobody (blank: the lab's owner); HTTP drops the blanks around a value
BLANKS = "[ \\t]*"
CALLER = {"type": "string", "pattern": f"^{BLANKS}(?:{_none_of(sorted(RESERVED_NAMES), BLANKS + '$')}"
                                       f"{USERNAME.pattern[1:-1]})?{BLANKS}$"}
DEVICE_NAME = {"type": "string", "pattern": f"^(?!{re.escape(LEASE_PREFIX)}){NAME_PATTERN[1:]}"}
IMAGE_NAME = {"type": "string", "pattern": f"^(?![0-9a-fA-F]{{{MIN_PREFIX_DIGITS},}}$){NAME_PATTERN[1:]}",
              "description": "a name that does not look like a sha256's start"}
SHA256 = {"type": "string", "pattern": "^[0-9a-fA-F]{64}$"}
# an image's reference: a name, or 'sha256:' and the start of a digest (images.parse_ref)
IMAGE_REF = {"pattern": f"^(?:(?!{DIGEST_PREFIX})[^\\x00]*|{DIGEST_PREFIX}[0-9a-fA-F]{{{MIN_PREFIX_DIGITS},64}})$"}
ADDRESS = {"anyOf": [{"pattern": "^[^:]*$"}, {"format": "ipv6"}]}  # one with a colon is an IPv6 address
LEASE_LENGTH = {"type": "number", "minimum": 1}  # and the lab's --max-ttl at most
# A matrix's group, read as group_target (core/ab/jobs.py) reads it: KEY=VALUE, each stripped
# of what Python's str.strip() takes away; a device's or a class's name of 64 characters at most,
# 1 to 16 tags (empty ones between the commas left out)
_SPACES = "\\t\\n\\x0b\\x0c\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
_NAMED = f"[{_SPACES}]*=[{_SPACES}]*[^{_SPACES}\\x00](?:[^\\x00]{{0,62}}[^{_SPACES}\\x00])?[{_SPACES}]*"
_TAG = f"[^{_SPACES},\\x00](?:[^,\\x00]{{0,{MAX_TAG_CHARS - 2}}}[^{_SPACES},\\x00])?"
_TAGS = f"[{_SPACES}]*=[{_SPACES},]*{_TAG}(?:[{_SPACES}]*,[{_SPACES},]*{_TAG}){{0,15}}[{_SPACES},]*"
DEVICE_GROUP = f"^[{_SPACES}]*device{_NAMED}$"
MATRIX_GROUP = f"^[{_SPACES}]*(?:device{_NAMED}|class{_NAMED}|tags{_TAGS})$"
# a fallback goes with needs any, and its wait with a fallback (core/needs.py)
FALLBACK: list[dict[str, Any]] = [
    {"properties": {"fallback": {"type": "null"}, "fallback_after_s": {"type": "null"}}},
    {"required": ["needs", "fallback"], "properties": {"needs": {"const": Needs.ANY.value},
                                                       "fallback": {"const": Needs.REAL_HW.value}}}]
NO_DEVICE = {"enum": [None, ""]}  # (an empty name names none)
def _each_with_each(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The branches of ``anyOf: first`` and ``anyOf: second`` both holding, as one ``anyOf``
    (one of each, their requirements and properties merged): a flat list, as the document's
    other checks are, rather than an ``allOf`` of them."""
    merged = []
    for one in first:
        for other in second:
            properties = {name: {**one.get("properties", {}).get(name, {}), **schema}
                          for name, schema in other.get("properties", {}).items()}
            merged.append({"required": sorted(set(one.get("required", [])) | set(other.get("required", []))),
                           "properties": {**one.get("properties", {}), **properties}})
    return merged


# What the rules check beyond the request models, as (model, field): schema (a field that may
# be null keeps its null; field None: the model's own schema).
CHECKED: dict[tuple[str, str | None], dict[str, Any]] = {
    ("TokenIn", None): {"oneOf": [  # a token is for a person or for an exporter's host (which takes no scope or band)
        {"required": ["user"], "properties": {"user": {"type": "string"}, "exporter_host": {"type": "null"}}},
        {"required": ["exporter_host"],
         "properties": {"exporter_host": {"type": "string"}, "user": {"type": "null"}, "scope": {"type": "null"},
                        "band": {"const": "normal"}}}],
        # a scope never makes an admin (identity.check_token_scope)
        "anyOf": [{"properties": {"admin": {"const": False}}}, {"properties": {"scope": {"type": "null"}}}]},
    ("TokenSetIn", None): {"anyOf": [{"properties": {"unscoped": {"const": False}}},  # unscoped, or a scope
                                     {"properties": {"scope": {"type": "null"}}}]},
    ("Heartbeat", "protocol"): {"type": "integer", "const": PROTOCOL_VERSION,
                                "description": "the exporter protocol this coordinator speaks"},
    # reserve: a device by name, or a class and/or tags, or needs (scheduler.py), and a fallback
    # as needs take it: one flat anyOf of both
    ("ReserveIn", None): {"anyOf": _each_with_each(
        [{"required": ["device"], "properties": {"device": {"type": "string"}, "class": {"type": "null"},
                                                "tags": {"maxItems": 0}}},
         {"required": ["class"], "properties": {"class": {"type": "string"}, "device": {"type": "null"}}},
         {"required": ["tags"], "properties": {"tags": {"minItems": 1}, "device": {"type": "null"}}},
         {"required": ["needs"], "properties": {"needs": {"type": "string"}, "device": {"type": "null"}}}],
        FALLBACK)},
    # a job runs its commands or an A/B pair, and a matrix expands a pair (core/ab/jobs.py); a
    # fallback as needs take it, and a job on one device has groups of devices only
    ("JobSpec", None): {"oneOf": [
        {"required": ["run"], "properties": {"run": {"minItems": 1}, "ab": {"type": "null"},
                                             "matrix": {"type": "null"}}},
        {"required": ["ab"], "properties": {"ab": {"type": "object"}, "run": {"maxItems": 0}}}],
        "anyOf": _each_with_each(FALLBACK, [
            {"properties": {"target": {"properties": {"device": NO_DEVICE}}}},
            {"properties": {"matrix": {"properties": {"over": {"items": {"pattern": DEVICE_GROUP}}}}}}])},
    ("Target", None): {"anyOf": [{"properties": {"device": NO_DEVICE}},  # a device, or a class and/or tags
                                 {"properties": {"class": NO_DEVICE, "tags": {"maxItems": 0}}}]},
    # a cell's reservation: a device, or a class and/or tags; a retry's exclusions pick the device (jobs.py)
    ("JobReserveIn", None): {"anyOf": [{"properties": {"device": {"type": "null"}}},
                                       {"properties": {"class": {"type": "null"}, "tags": {"maxItems": 0}}},
                                       {"required": ["exclude"], "properties": {"exclude": {"minItems": 1}}}]},
    ("MatrixSpec", "over"): {"items": {"pattern": MATRIX_GROUP}},
    ("MetricSpec", "regex"): {"pattern": "^[^\\x00]*\\(\\?P<value>[^\\x00]*$"},  # a group named value
    # a flash takes its image, and nothing else (operations.py)
    ("OperationIn", None): {"anyOf": [
        {"properties": {"kind": {"not": {"const": FLASH_KIND}}}},
        {"required": ["args"], "properties": {"args": {"required": ["image"], "maxProperties": 1, "properties": {
            "image": {"type": "string", **IMAGE_REF}}}}}]},
    **{(model, field): IMAGE_REF for model, field in (("ImageRefIn", "ref"), ("KnownGoodIn", "ref"),
                                                     ("FlashIn", "image"), ("ReserveIn", "image"))},
    ("EndpointReport", "host"): ADDRESS, ("Heartbeat", "address"): ADDRESS,
    # a power operation's off_time_s goes with a cycle
    **{(model, None): {"anyOf": [{"required": ["action"], "properties": {"action": {"const": "cycle"}}},
                                 {"properties": {"off_time_s": {"type": "null"}}}]}
       for model in ("PowerIn", "AdminPowerIn")},
    ("DeviceReport", "name"): DEVICE_NAME, ("AdoptIn", "name"): DEVICE_NAME,
    ("TokenIn", "user"): PERSON, ("TokenIn", "exporter_host"): PERSON,
    ("ReserveIn", "ttl_s"): LEASE_LENGTH, ("RenewIn", "ttl_s"): LEASE_LENGTH,
    ("UploadQuery", "name"): IMAGE_NAME, ("UploadQuery", "sha256"): SHA256}
# Every refusal, and when it comes (each operation lists those it can answer: ``_refusals``).
REFUSALS = {
    400: "a malformed request: a NUL character in the URL, a query parameter out of its range, a body that is no "
         "JSON, an Idempotency-Key too long",
    401: "no credentials, or a token that is unknown, revoked or expired (a token sent is checked on every route)",
    403: "credentials that may not call this, or a request from a page of another origin",
    404: "what the request names does not exist (or is not the caller's): a device, a device class, an image...",
    408: "the request body stopped arriving",
    409: "the lab's state refuses it: taken, busy, ended, offline, a name several images have, an image for "
         "another device...",
    410: "the image's file is gone from the registry",
    413: "a body over this route's limit (or an image over the lab's limit or the uploader's quota)",
    415: "a body that is not of the type the route takes (JSON)",
    421: "a Host this coordinator is not reached by",
    422: "a request the rules refuse: a body the model refuses (and what no JSON Schema says: a repeated name in a "
         "report, a device node's mode that is world-writable, a regular expression Python or RE2 cannot read, an "
         "upload whose bytes are not what it declared, the arguments of a kind its device's plugins declare, a cell "
         "its job does not have, a scope's class no device has or operation nothing here runs), an "
         "Idempotency-Key used before for another request",
    429: "a lease that starts operations faster than its share (a burst, then a few a second): Retry-After says "
         "when the next may start",
    503: "the lab's database cannot be reached for now: Retry-After says when to ask again (with the same "
         "Idempotency-Key, a change is made once); or what the call needs is not here (an image folder, a module)",
    507: "the image registry's disk is full: nothing of the upload is kept",
}
# The codes the coordinator answers: core/errors.py lists them first, then the client's own
# (which no answer carries), from BAD_ANSWER on
ANSWERED = list(ErrorCode)[:list(ErrorCode).index(ErrorCode.BAD_ANSWER)]
ERROR = {"type": "object", "required": ["error", "message"], "additionalProperties": False,
         "properties": {"error": {"type": "string", "enum": [code.value for code in ANSWERED],
                                  "description": "a short code a client can act on"},
                        "message": {"type": "string", "description": "what went wrong, as a sentence"}}}
JSON_OBJECT, JSON_LIST = {"type": "object"}, {"type": "array", "items": {"type": "object"}}
BINARY = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
REF = "#/components/schemas/{model}"
ERROR_CONTENT = {"application/json": {"schema": {"$ref": REF.format(model="Error")}}}


def answers(media_type: str):
    """Mark a handler that answers ``media_type``, not JSON: the document leaves it out."""
    def mark(handler):
        handler.media_type = media_type
        return handler
    return mark


def documented(calls: list) -> list:
    """The calls the document describes: those with a REST route."""
    return [call for call in calls if call.path is not None]


def document(calls: list, max_wait_s: float, max_key_chars: int, max_ttl_s: float | None = None,
             single_user: bool = False) -> dict:
    """The OpenAPI document of the REST routes of ``calls``; long-polls wait ``max_wait_s``
    at most, an Idempotency-Key has ``max_key_chars`` at most, a lease ``max_ttl_s`` (the
    lab's). ``single_user``: the trust mode, where no route needs a token and
    ``X-Device-Loop-User`` says who calls (elsewhere it is ignored, and not described)."""
    calls = documented(calls)
    mode: Literal["validation"] = "validation"
    models = list(dict.fromkeys([(c.args, mode) for c in calls]
                                + [(c.body, mode) for c in calls if c.body is not None]))
    refs, defs = models_json_schema(models, ref_template=REF, by_alias=True)
    schemas: dict[str, Any] = defs.get("$defs", {})
    answers = {c.name: _answer_schema(c.answer, schemas) for c in calls}
    _add_checks(schemas, max_ttl_s)
    _no_nul(schemas)
    key = {"name": "Idempotency-Key", "in": "header", "required": False,
           "schema": {"type": "string", "maxLength": max_key_chars},
           "description": "a repeat with this key answers as the first call did, and changes nothing"}
    user = {"name": USER_HEADER, "in": "header", "required": False, "schema": CALLER,
            "description": "who calls (the trust mode takes the caller's word; default: the lab's owner)"}
    paths: dict[str, dict] = {}
    for call in calls:
        operation = _operation(call, refs, schemas, answers[call.name], single_user)
        if call.idempotent:
            operation["parameters"].append(key)
        if single_user:
            operation["parameters"].append(user)
            operation.pop("security", None)
        paths.setdefault(openapi_path(call.route), {})[call.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "device-loop coordinator", "version": __version__,
                 "description": f"Exporter protocol {PROTOCOL_VERSION}. Every refusal is a 4xx (or a 503: the "
                                "database out of reach; a 507: the registry's disk full) with an `Error` body; "
                                "mutating calls take an `Idempotency-Key`."},
        "paths": paths,
        "components": {
            "schemas": {**schemas, "Error": ERROR},
            "responses": {str(status): {"description": f"refused: {when}", "content": ERROR_CONTENT}
                          for status, when in REFUSALS.items()},
            "securitySchemes": {} if single_user else {
                "token": {"type": "http", "scheme": "bearer",
                          "description": "an API token (`device-loop admin token create`)"}},
        },
        "security": [] if single_user else [{"token": []}],
    }


def _answer_schema(answer: Any, schemas: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON Schema of an answer's type (its definitions go to ``schemas``); None for bytes."""
    if answer is bytes:
        return None
    if answer is dict:
        return dict(JSON_OBJECT)
    schema = TypeAdapter(answer).json_schema(mode="serialization", ref_template=REF)
    for name, definition in schema.pop("$defs", {}).items():
        if schemas.setdefault(name, definition) != definition:
            raise ValueError(f"two schemas are named {name}: give one of them another name")
    return schema


def _add_checks(schemas: dict, max_ttl_s: float | None) -> None:
    """What the rules check beyond the models (``CHECKED``), written into their schemas."""
    checked = dict(CHECKED)
    if max_ttl_s is not None:
        for model in ("ReserveIn", "RenewIn"):
            checked[(model, "ttl_s")] = {**checked[(model, "ttl_s")], "maximum": max_ttl_s}
        # a scope's longest lease is the lab's at most (Admin.judge_scope)
        checked[("TokenScope", "max_lease_s")] = {"maximum": min(MAX_SCOPE_LEASE_S, max_ttl_s)}
    for (model, field), schema in checked.items():
        if model not in schemas:
            continue
        if field is None:
            schemas[model].update(schema)
            continue
        prop = schemas[model]["properties"][field]
        branches = prop.get("anyOf", [prop])  # a field that may be null: its other branch
        for branch in branches:
            if branch.get("type") != "null":
                _merge(branch, schema)


def _merge(schema: dict[str, Any], checked: dict[str, Any]) -> None:
    """``checked`` written into ``schema``, a nested object's keys into its own."""
    for key, value in checked.items():
        if isinstance(value, dict) and isinstance(schema.get(key), dict):
            _merge(schema[key], value)
        else:
            schema[key] = value


def _no_nul(schema) -> None:
    """Every string of ``schema`` (a JSON Schema, walked whole) without a pattern of its own
    gets ``NO_NUL``; an object's free keys too. An object whose keys follow patterns (a
    ``dict`` of keys with a pattern, as pydantic writes it) takes no key that follows none."""
    if isinstance(schema, dict):
        if schema.get("type") == "string" and "pattern" not in schema and "enum" not in schema \
                and "const" not in schema and "format" not in schema:
            schema["pattern"] = NO_NUL
        if "patternProperties" in schema:
            schema.setdefault("additionalProperties", False)
        if isinstance(schema.get("additionalProperties"), dict) or "propertyNames" in schema:
            schema.setdefault("propertyNames", {}).setdefault("pattern", NO_NUL)
        for value in schema.values():
            _no_nul(value)
    elif isinstance(schema, list):
        for value in schema:
            _no_nul(value)


def openapi_path(path: str) -> str:
    """A route's path as OpenAPI writes it: ``{identifier:path}`` is Starlette's."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", path)


def _operation(call, refs: dict, schemas: dict, answer: dict[str, Any] | None, single_user: bool) -> dict:
    model: type[BaseModel] = call.args
    own = copy.deepcopy(schemas.get(model.__name__, {"properties": {}}))
    own.setdefault("properties", {})
    in_path = re.findall(r"\{(\w+)", call.path)
    parameters = [{"name": p, "in": "path", "required": True, "schema": own["properties"].pop(p, dict(TEXT))}
                  for p in in_path]
    required = [r for r in own.get("required", []) if r not in in_path]
    responses = _responses(call, answer) | {str(status): {"$ref": f"#/components/responses/{status}"}
                                            for status in _refusals(call, single_user)}
    operation: dict[str, Any] = {"operationId": call.name, "parameters": parameters, "responses": responses,
                                 "x-access": call.access}
    if call.doc:
        operation["description"] = call.doc
    if call.access == ANYONE:
        operation["security"] = []
    if call.method in SAFE_METHODS or call.body is not None or call.streamed:
        parameters += [{"name": name, "in": "query", "required": name in required, "schema": schema}
                       for name, schema in own["properties"].items()]
    elif own["properties"]:
        body = {**own, "required": required} if required else {k: v for k, v in own.items() if k != "required"}
        schemas[f"{call.name}_body"] = body
        required_body = bool(required) or "oneOf" in body or "anyOf" in body  # else {} will do
        operation["requestBody"] = {"required": required_body,
                                    "content": {"application/json": {"schema": {"$ref": REF.format(
                                        model=f"{call.name}_body")}}}}
    if call.body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": refs[(call.body, "validation")]}}}
    elif call.streamed:
        operation["requestBody"] = {"required": False, "content": BINARY}
    return operation


def _responses(call, answer: dict[str, Any] | None) -> dict:
    content = (BINARY if answer is None else {call.media_type.split(";")[0]: {"schema": answer}} if call.media_type
               else {"application/json": {"schema": answer}})
    statuses = [str(call.status)] + (["200"] if call.streamed else [])  # (an upload: bytes it had already)
    return {status: {"description": "created" if status == "201" else "done", "content": content}
            for status in statuses}


def _refusals(call, single_user: bool) -> list[int]:
    """The statuses of ``REFUSALS`` a call's route can answer: what every route can (a NUL in
    its URL, a page of another origin, a Host it is not reached by; with tokens, a token
    refused, on any route it is sent to, and looked up in the database), what the call's
    shape tells (a path that names something, a body, the database), and what its rules
    refuse besides (``Call.refusals``)."""
    statuses = {400, 403, 421} | call.refusals
    if not single_user:
        statuses |= {401, 503}
    if call.database:
        statuses.add(503)
    if set(re.findall(r"\{(\w+)", call.path)) - _own_host(call):
        statuses.add(404)
    if call.method not in SAFE_METHODS:  # a body: its pace, its size, what its model refuses; the lab's state
        statuses |= {408, 409, 413, 422} | (set() if call.streamed else {415})  # (an upload: any bytes)
    return sorted(statuses)


def _own_host(call) -> set[str]:
    """In an exporter's call, the path's name of its own host: never unknown (its heartbeat
    makes it known; what it should run is nothing, until then)."""
    return {"name"} if call.access == EXPORTER else set()
