"""The OpenAPI 3.1 description of the REST API (``GET /api/v1/openapi.json``), made from
the route table (``api.ROUTES``) and the pydantic models the coordinator validates
requests with: no wire shape is written here a second time, only what the rules check
beyond a model (``CHECKED``). Answers that have no model (only the desired state has one)
are described as JSON objects or lists. Routes that do not answer JSON (the web page, its
files, metrics, the event stream) are not described."""
from __future__ import annotations

import re

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from device_loop.core import LEASE_PREFIX, NAME_PATTERN, PROTOCOL_VERSION, __version__
from device_loop.core.protocol import DesiredState

from .identity import ANYONE, RESERVED_NAMES, SAFE_METHODS, USER_HEADER, USERNAME
from .images import MIN_PREFIX_DIGITS

# What the route table does not say, by handler name (and in _query, the query parameters).
CREATES = {"reserve", "flash", "recover", "recover_unleased", "create_token", "adopt_candidate", "upload_image"}
LISTS = {"list_devices", "device_log", "device_flashes", "list_hosts", "my_leases", "list_images", "list_tokens",
         "audit_log", "list_candidates"}
ANSWER_MODELS = {"heartbeat": DesiredState, "desired": DesiredState}
BYTES_IN, BYTES_OUT = {"upload_image"}, {"image_content"}  # an image, streamed
ALSO_200 = {"upload_image"}  # bytes the registry has already
ALSO_404 = {"list_images"}  # what it names in the query may not exist (as what a path or a body names)
ALSO_422 = {"image_info"}  # a reference may be malformed, or name several images
ALSO_410 = {"image_content"}

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
LEASE_LENGTH = {"type": "number", "minimum": 1}  # and the lab's --max-ttl at most
# What the rules check beyond the request models, as (model, field): schema (a field that may
# be null keeps its null; field None: the model's own schema).
CHECKED = {("TokenIn", None): {"oneOf": [  # a token is for a person or for an exporter's host
               {"required": ["user"], "properties": {"user": {"type": "string"}, "exporter_host": {"type": "null"}}},
               {"required": ["exporter_host"],
                "properties": {"exporter_host": {"type": "string"}, "user": {"type": "null"}}}]},
           ("Heartbeat", "protocol"): {"type": "integer", "const": PROTOCOL_VERSION,
                                       "description": "the exporter protocol this coordinator speaks"},
           ("DeviceReport", "name"): DEVICE_NAME, ("AdoptIn", "name"): DEVICE_NAME,
           ("TokenIn", "user"): PERSON, ("TokenIn", "exporter_host"): PERSON,
           ("ReserveIn", "ttl_s"): LEASE_LENGTH, ("RenewIn", "ttl_s"): LEASE_LENGTH}
# Every refusal, and when it comes (each operation lists those it can answer).
REFUSALS = {
    400: "a malformed request: a NUL character in the URL, a query parameter out of its range, a body that is no "
         "JSON, an Idempotency-Key too long",
    401: "no credentials, or a token that is unknown, revoked or expired",
    403: "credentials that may not call this, or a request from a page of another origin",
    404: "what the request names does not exist (or is not the caller's)",
    408: "the request body stopped arriving",
    409: "the lab's state refuses it: taken, busy, ended, offline...",
    410: "the image's file is gone from the registry",
    413: "a body over this route's limit (or an image over the lab's limit or the uploader's quota)",
    415: "a body that is not of the type the route takes (JSON)",
    421: "a Host this coordinator is not reached by",
    422: "a request the rules refuse: a body the model refuses, a name or reference that names nothing usable, an "
         "Idempotency-Key used before for another request",
}
ERROR = {"type": "object", "required": ["error", "message"], "additionalProperties": False,
         "properties": {"error": {"type": "string", "description": "a short code a client can act on"},
                        "message": {"type": "string", "description": "what went wrong, as a sentence"}}}
JSON_OBJECT, JSON_LIST = {"type": "object"}, {"type": "array", "items": {"type": "object"}}
BINARY = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
REF = "#/components/schemas/{model}"
ERROR_CONTENT = {"application/json": {"schema": {"$ref": REF.format(model="Error")}}}


def answers(media_type: str):
    """Mark a handler that answers ``media_type``, not JSON: ``documented`` leaves it out."""
    def mark(handler):
        handler.media_type = media_type
        return handler
    return mark


def documented(routes: list[tuple]) -> list[tuple]:
    """The rows of the route table the document describes: those that answer JSON."""
    return [row for row in routes if not hasattr(row[3], "media_type")]


def document(routes: list[tuple], max_wait_s: float, max_key_chars: int, max_ttl_s: float | None = None,
             single_user: bool = False) -> dict:
    """The OpenAPI document of ``routes``, rows ``(method, path, access, handler)`` of the
    route table (those that answer JSON); long-polls wait ``max_wait_s`` at most, an
    Idempotency-Key has ``max_key_chars`` at most, a lease ``max_ttl_s`` (the lab's).
    ``single_user``: the trust mode, where no route needs a token and ``X-Device-Loop-User``
    says who calls (elsewhere it is ignored, and not described)."""
    routes = documented(routes)
    wanted = [(h.body_model, "validation") for *_, h in routes if hasattr(h, "body_model")]
    wanted += [(model, "serialization") for model in ANSWER_MODELS.values()]
    refs, defs = models_json_schema(list(dict.fromkeys(wanted)), ref_template=REF)
    schemas = defs.get("$defs", {})
    _add_checks(schemas, max_ttl_s)
    query = _query(max_wait_s)
    key = {"name": "Idempotency-Key", "in": "header", "required": False,
           "schema": {"type": "string", "maxLength": max_key_chars},
           "description": "a repeat with this key answers as the first call did, and changes nothing"}
    user = {"name": USER_HEADER, "in": "header", "required": False, "schema": CALLER,
            "description": "who calls (the trust mode takes the caller's word; default: the lab's owner)"}
    paths: dict[str, dict] = {}
    for method, path, access, handler in routes:
        operation = _operation(method, path, access, handler, refs, schemas, query.get(handler.__name__, {}))
        if getattr(handler, "idempotent", False):
            operation["parameters"].append(key)
        if single_user:
            operation["parameters"].append(user)
            operation.pop("security", None)
        paths.setdefault(openapi_path(path), {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "device-loop coordinator", "version": __version__,
                 "description": f"Exporter protocol {PROTOCOL_VERSION}. Every refusal is a 4xx with an "
                                "`Error` body; mutating calls take an `Idempotency-Key`."},
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


def _add_checks(schemas: dict, max_ttl_s: float | None) -> None:
    """What the rules check beyond the models (``CHECKED``), written into their schemas."""
    checked = dict(CHECKED)
    if max_ttl_s is not None:
        for model in ("ReserveIn", "RenewIn"):
            checked[(model, "ttl_s")] = {**checked[(model, "ttl_s")], "maximum": max_ttl_s}
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
                branch.update(schema)
    _no_nul(schemas)


def _no_nul(schema) -> None:
    """Every string of ``schema`` (a JSON Schema, walked whole) without a pattern of its own
    gets ``NO_NUL``; an object's free keys too."""
    if isinstance(schema, dict):
        if schema.get("type") == "string" and "pattern" not in schema and "enum" not in schema \
                and "const" not in schema:
            schema["pattern"] = NO_NUL
        if isinstance(schema.get("additionalProperties"), dict):
            schema.setdefault("propertyNames", {"pattern": NO_NUL})
        for value in schema.values():
            _no_nul(value)
    elif isinstance(schema, list):
        for value in schema:
            _no_nul(value)


def openapi_path(path: str) -> str:
    """A route's path as OpenAPI writes it: ``{identifier:path}`` is Starlette's."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", path)


def _query(max_wait_s: float) -> dict[str, dict[str, tuple[dict, bool]]]:
    """The query parameters each handler reads: name -> (schema, required)."""
    wait = ({"type": "number", "minimum": 0, "maximum": max_wait_s,
             "description": "long-poll: answer once the state changes, or after this many seconds"}, False)
    return {
        "desired": {"etag": (TEXT, False), "boot": (TEXT, False), "wait": wait},
        "my_leases": {"device": (TEXT, False)},
        "lease_status": {"wait": wait, "unless": (TEXT, False)},
        "flash_op": {"wait": wait, "unless": (TEXT, False)},
        "upload_image": {"name": (IMAGE_NAME, True), "for": (TEXT, True),
                         "description": ({**TEXT, "maxLength": 1000}, False), "sha256": (SHA256, False),
                         "size": (WHOLE, False)},
        "list_images": {"device": (TEXT, False)},
    }


def _operation(method: str, path: str, access: str, handler, refs: dict, schemas: dict, query: dict) -> dict:
    name = handler.__name__
    parameters = [{"name": p, "in": "path", "required": True, "schema": TEXT} for p in re.findall(r"\{(\w+)", path)]
    parameters += [{"name": q, "in": "query", "required": required, "schema": schema}
                   for q, (schema, required) in query.items()]
    responses = _responses(name, refs) | {str(status): {"$ref": f"#/components/responses/{status}"}
                                          for status in _refusals(method, path, access, handler)}
    operation = {"operationId": name, "parameters": parameters, "responses": responses, "x-access": access}
    if handler.__doc__:
        operation["description"] = " ".join(handler.__doc__.split())
    if access == ANYONE:
        operation["security"] = []
    model: type[BaseModel] | None = getattr(handler, "body_model", None)
    if model is not None:
        required = any(field.is_required() for field in model.model_fields.values()) \
            or "oneOf" in schemas.get(model.__name__, {})  # else {} will do
        operation["requestBody"] = {
            "required": required, "content": {"application/json": {"schema": refs[(model, "validation")]}}}
    elif name in BYTES_IN:
        operation["requestBody"] = {"required": False, "content": BINARY}
    return operation


def _responses(name: str, refs: dict) -> dict:
    if name in BYTES_OUT:
        content = BINARY
    else:
        model = ANSWER_MODELS.get(name)
        schema = refs[(model, "serialization")] if model else JSON_LIST if name in LISTS else JSON_OBJECT
        content = {"application/json": {"schema": schema}}
    statuses = (["201"] if name in CREATES else ["200"]) + (["200"] if name in ALSO_200 else [])
    return {status: {"description": "created" if status == "201" else "done", "content": content}
            for status in statuses}


def _refusals(method: str, path: str, access: str, handler) -> list[int]:
    """The statuses of ``REFUSALS`` an operation can answer."""
    name = handler.__name__
    statuses = {400, 403, 421} | ({401} if access != ANYONE else set())
    if "{" in path or method not in SAFE_METHODS or name in ALSO_404:
        statuses.add(404)
    if method not in SAFE_METHODS:  # a body: its size, type, pace; the lab's state
        statuses |= {408, 409, 413, 415, 422}
    statuses |= {422} if name in ALSO_422 else set()
    statuses |= {410} if name in ALSO_410 else set()
    return sorted(statuses)
