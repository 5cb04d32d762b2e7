"""The OpenAPI 3.1 description of the REST API (``GET /api/v1/openapi.json``), made from
the route table (``api.ROUTES``) and the pydantic models the coordinator validates
requests with: no wire shape is written here a second time. Answers that have no model
(only the desired state has one) are described as JSON objects or lists. Routes that do
not answer JSON (the web page, its files, metrics, the event stream) are not described."""
from __future__ import annotations

import re

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from device_loop.core import PROTOCOL_VERSION, __version__
from device_loop.core.protocol import DesiredState

from .identity import ANYONE, USER_HEADER

# What the route table does not say, by handler name (and in _query, the query parameters).
CREATES = {"reserve", "flash", "recover", "recover_unleased", "create_token", "adopt_candidate", "upload_image"}
LISTS = {"list_devices", "device_log", "device_flashes", "list_hosts", "my_leases", "list_images", "list_tokens",
         "audit_log", "list_candidates"}
ANSWER_MODELS = {"heartbeat": DesiredState, "desired": DesiredState}
BYTES_IN, BYTES_OUT = {"upload_image"}, {"image_content"}  # an image, streamed
ALSO_200 = {"upload_image"}  # bytes the registry has already

TEXT, WHOLE = {"type": "string"}, {"type": "integer", "minimum": 0}
ERROR = {"type": "object", "required": ["error", "message"], "additionalProperties": False,
         "properties": {"error": {"type": "string", "description": "a short code a client can act on"},
                        "message": {"type": "string", "description": "what went wrong, as a sentence"}}}
JSON_OBJECT, JSON_LIST = {"type": "object"}, {"type": "array", "items": {"type": "object"}}
BINARY = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
REF = "#/components/schemas/{model}"


def answers(media_type: str):
    """Mark a handler that answers ``media_type``, not JSON: ``documented`` leaves it out."""
    def mark(handler):
        handler.media_type = media_type
        return handler
    return mark


def documented(routes: list[tuple]) -> list[tuple]:
    """The rows of the route table the document describes: those that answer JSON."""
    return [row for row in routes if not hasattr(row[3], "media_type")]


def document(routes: list[tuple], max_wait_s: float, max_key_chars: int) -> dict:
    """The OpenAPI document of ``routes``, rows ``(method, path, access, handler)`` of the
    route table (those that answer JSON); long-polls wait ``max_wait_s`` at most, an
    Idempotency-Key has ``max_key_chars`` at most."""
    routes = documented(routes)
    wanted = [(h.body_model, "validation") for *_, h in routes if hasattr(h, "body_model")]
    wanted += [(model, "serialization") for model in ANSWER_MODELS.values()]
    refs, defs = models_json_schema(list(dict.fromkeys(wanted)), ref_template=REF)
    query = _query(max_wait_s)
    key = {"name": "Idempotency-Key", "in": "header", "required": False,
           "schema": {"type": "string", "maxLength": max_key_chars},
           "description": "a repeat with this key answers as the first call did, and changes nothing"}
    paths: dict[str, dict] = {}
    for method, path, access, handler in routes:
        operation = _operation(path, access, handler, refs, query.get(handler.__name__, {}))
        if getattr(handler, "idempotent", False):
            operation["parameters"].append(key)
        paths.setdefault(openapi_path(path), {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "device-loop coordinator", "version": __version__,
                 "description": f"Exporter protocol {PROTOCOL_VERSION}. Every refusal is a 4xx with an "
                                "`Error` body; mutating calls take an `Idempotency-Key`."},
        "paths": paths,
        "components": {
            "schemas": {**defs.get("$defs", {}), "Error": ERROR},
            "responses": {"Error": {"description": "refused: why, as a code and a sentence",
                                    "content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}}}},
            "securitySchemes": {
                "token": {"type": "http", "scheme": "bearer",
                          "description": "an API token (`device-loop admin token create`)"},
                "user": {"type": "apiKey", "in": "header", "name": USER_HEADER,
                         "description": "who the caller is: in the single-user trust mode only, ignored otherwise"},
            },
        },
        "security": [{"token": []}, {"user": []}],
    }


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
        "upload_image": {"name": (TEXT, True), "for": (TEXT, True), "description": (TEXT, False),
                         "sha256": (TEXT, False), "size": (WHOLE, False)},
        "list_images": {"device": (TEXT, False)},
    }


def _operation(path: str, access: str, handler, refs: dict, query: dict) -> dict:
    name = handler.__name__
    parameters = [{"name": p, "in": "path", "required": True, "schema": TEXT} for p in re.findall(r"\{(\w+)", path)]
    parameters += [{"name": q, "in": "query", "required": required, "schema": schema}
                   for q, (schema, required) in query.items()]
    operation = {"operationId": name, "parameters": parameters, "responses": _responses(name, refs),
                 "x-access": access}
    if handler.__doc__:
        operation["description"] = " ".join(handler.__doc__.split())
    if access == ANYONE:
        operation["security"] = []
    model: type[BaseModel] | None = getattr(handler, "body_model", None)
    if model is not None:
        operation["requestBody"] = {
            "required": any(field.is_required() for field in model.model_fields.values()),  # else {} will do
            "content": {"application/json": {"schema": refs[(model, "validation")]}}}
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
    answers = {status: {"description": "created" if status == "201" else "done", "content": content}
               for status in statuses}
    return answers | {"4XX": {"$ref": "#/components/responses/Error"}}
