"""One error-code enum (core/errors.py's ``ErrorCode``) for the coordinator and the client:
every code the coordinator answers is a member, the client keys what it does on codes and
never on a message's words, and the coordinator's own name in its logs is one constant that
the reserved-names rule uses."""
import ast
from pathlib import Path

import pytest

from conftest import SRC
from device_loop.coordinator.calls import CALLS
from device_loop.coordinator.errors import APIError, not_found
from device_loop.coordinator.identity import RESERVED_NAMES, usable_name
from device_loop.coordinator.idempotency import MAX_KEY_CHARS
from device_loop.coordinator.openapi import document
from device_loop.coordinator.schemas import MAX_WAIT_S
from device_loop.coordinator.who import COORDINATOR
from device_loop.core.errors import ErrorCode
from device_loop.core.vocabulary import DeviceState

#: The calls that carry a code, and which argument is it (by position, or by keyword).
CODE_ARGUMENT = {"APIError": (1, "code"), "conflict": (0, "code"), "bad_request": (1, "code")}


def _modules(*folders: str) -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path))) for folder in folders
            for path in sorted((SRC / folder).rglob("*.py"))]


def _called(node: ast.Call) -> str | None:
    return node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)[:100]}"


def _literals(node: ast.AST) -> list[ast.Constant]:
    """The string literals an expression may evaluate to (an ``a if c else b`` is both)."""
    if isinstance(node, ast.IfExp):
        return _literals(node.body) + _literals(node.orelse)
    return [node] if isinstance(node, ast.Constant) and isinstance(node.value, str) else []


def _members(node: ast.AST) -> list[ast.Attribute]:
    """The ``ErrorCode.X`` an expression names."""
    return [n for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "ErrorCode"]


def test_every_code_the_coordinator_raises_is_an_error_code():
    """No code is written as a string where it is raised: an ``APIError``, ``conflict`` or
    ``bad_request`` names an ``ErrorCode`` member (mypy holds the rest to the type), a
    ``not_found("device", ...)`` names a kind whose ``unknown_device`` is one, and no
    answer's ``"error"`` is written by hand."""
    written, named, unknown = [], 0, []
    for path, tree in _modules("coordinator"):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _called(node) in CODE_ARGUMENT:
                position, keyword = CODE_ARGUMENT[_called(node)]
                given = [k.value for k in node.keywords if k.arg == keyword] + node.args[position:position + 1]
                for code in given:
                    written += [_where(path, literal) for literal in _literals(code)]
                    named += len(_members(code))
            elif isinstance(node, ast.Call) and _called(node) == "not_found" and node.args:
                kind = node.args[0]
                if isinstance(kind, ast.Constant) and f"unknown_{kind.value}" not in set(ErrorCode):
                    unknown.append(_where(path, node))
            elif isinstance(node, ast.Dict):
                written += [_where(path, value) for key, value in zip(node.keys, node.values)
                            if isinstance(key, ast.Constant) and key.value == "error" and _literals(value)]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ErrorCode":
                if node.attr not in ErrorCode.__members__:
                    unknown.append(_where(path, node))
    assert named > 60, f"the scan found {named} codes: has the way errors are raised changed?"
    assert not written, "codes written as strings, not ErrorCode members:\n" + "\n".join(written)
    assert not unknown, "codes ErrorCode lacks:\n" + "\n".join(unknown)


def test_the_openapi_document_lists_the_codes_the_coordinator_answers():
    """The document's ``Error.error`` is an enum of every code the coordinator's code answers
    (named, an ``unknown_KIND`` of a ``not_found``, a device's state that refuses a reserve),
    and of none of the client's own."""
    # a device's state that refuses a reserve is its code (leases.py makes it from the state's value)
    answered = {ErrorCode(state.value) for state in DeviceState if state != DeviceState.IDLE}
    for path, tree in _modules("coordinator"):
        for node in ast.walk(tree) if path.name != "openapi.py" else ():  # (it describes them, answers none)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ErrorCode":
                answered.add(ErrorCode[node.attr])
            elif isinstance(node, ast.Call) and _called(node) == "not_found" and isinstance(node.args[0], ast.Constant):
                answered.add(ErrorCode(f"unknown_{node.args[0].value}"))
    for single_user in (False, True):
        error = document(CALLS, MAX_WAIT_S, MAX_KEY_CHARS, single_user=single_user)["components"]["schemas"]["Error"]
        codes = error["properties"]["error"]["enum"]
        assert len(codes) == len(set(codes)) and set(codes) == {code.value for code in answered}, \
            "the codes core/errors.py lists as the coordinator's are those it answers"


def test_a_not_found_answers_an_error_code():
    error = not_found("device", "nope")
    assert isinstance(error, APIError) and error.code is ErrorCode.UNKNOWN_DEVICE
    assert error.to_json() == {"error": "unknown_device", "message": "unknown device 'nope'"}
    with pytest.raises(ValueError):
        not_found("thing-nobody-declared", "x")


def test_a_device_state_that_refuses_a_reserve_is_its_code():
    """A reserve refused for the device's state answers the state as its code (leases.py)."""
    assert {state.value for state in DeviceState} - {DeviceState.IDLE.value} <= set(ErrorCode)


def test_the_client_keys_on_codes_never_on_message_text():
    """In the library and the commands: a code is compared with ``ErrorCode`` members (never a
    string), and nothing reads a refusal's message to decide what to do."""
    found = []
    for path, tree in _modules("client", "cli"):
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Attribute) and s.attr == "message" for s in sides):
                    found.append("compares a message: " + _where(path, node))
                if any(isinstance(s, ast.Attribute) and s.attr == "code" for s in sides):
                    found += ["compares a code with a string: " + _where(path, node) for s in sides
                              for literal in ([s] if isinstance(s, ast.Constant) else getattr(s, "elts", []))
                              if isinstance(literal, ast.Constant) and isinstance(literal.value, str)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("startswith", "endswith", "find", "index", "count") and \
                    isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "message":
                found.append("reads a message: " + _where(path, node))
            elif isinstance(node, ast.Call) and _called(node) in ("CoordinatorError", "LeaseFailed", "TicketEnded") \
                    and node.args and _literals(node.args[0]):
                found.append("a code written as a string: " + _where(path, node))
    assert not found, "\n".join(found)


def test_the_coordinators_own_name_is_one_constant_nobody_may_take():
    assert COORDINATOR in RESERVED_NAMES and not usable_name(COORDINATOR) and not usable_name(COORDINATOR.upper())
    writes = [f"{path.relative_to(SRC)}:{node.lineno}" for path, tree in _modules("coordinator")
              for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value == COORDINATOR
              and path.name not in ("who.py", "serve.py")]  # (serve.py: the command is called coordinator)
    assert not writes, f"the coordinator's name written again (use who.COORDINATOR): {writes}"
