"""What a call's code can answer, found by reading it: every status of an ``APIError`` its
``run`` (and what that calls, to any depth) makes, and whether it reaches the store (its
database). For tests/test_openapi.py, which holds the OpenAPI document to it.

The reading follows what Python code says a name is: a function or class of the
coordinator's modules, a method of an instance whose class an annotation or an assignment
in ``__init__`` names (``self.images = Images(...)``, ``life: Lifecycle``), a local given
one of those. A function passed on (a callback) counts as called. Branches are not told
apart: a status any path of a function can make counts (``Operations._start`` spends a
lease's share, 429, only with a lease: a call without one is said to reach it too).
"""
from __future__ import annotations

import ast
import functools
import inspect
import sys
import textwrap
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from device_loop.coordinator.errors import APIError

PACKAGE = "device_loop.coordinator"
STORE = PACKAGE + ".store"


def _ours(thing: Any) -> bool:
    return (getattr(thing, "__module__", None) or "").startswith(PACKAGE + ".") and (
        inspect.isfunction(thing) or inspect.isclass(thing))


@functools.cache
def _tree(function) -> ast.AST | None:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError):
        return None


def _classes(annotation: Any, namespace: dict) -> list[type]:
    """The classes an annotation (or its text) says a value is one of."""
    if isinstance(annotation, str):
        try:
            annotation = eval(annotation, dict(namespace))  # (the module's names: what the annotation means)
        except Exception:
            return []
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [c for member in typing.get_args(annotation) for c in _classes(member, namespace)]
    return [annotation] if isinstance(annotation, type) and not isinstance(annotation, types.GenericAlias) else []


def _parameters(function) -> dict[str, list]:
    return {name: _classes(p.annotation, function.__globals__)
            for name, p in inspect.signature(function).parameters.items() if p.annotation is not p.empty}


@dataclass(frozen=True)
class _Value:
    """A name's value itself (a module, a function, a class as such), not an instance."""
    value: Any


@dataclass(frozen=True)
class _Method:
    owner: type
    function: Any


@functools.cache
def _attributes(cls: type) -> dict[str, list]:
    """What the attributes of ``cls``'s instances are: its (and its bases') annotations and
    what their ``__init__`` assigns to ``self``."""
    found: dict[str, list] = {}
    for klass in reversed(cls.__mro__):
        if not _ours(klass):
            continue
        namespace = vars(sys.modules[klass.__module__])
        for name, annotation in klass.__dict__.get("__annotations__", {}).items():
            found[name] = _classes(annotation, namespace)
        init = klass.__dict__.get("__init__")
        tree = _tree(init) if init is not None else None
        if tree is None:
            continue
        scope = _Scope(init, _parameters(init), klass)
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign) and _is_self_attribute(node.target):
                found[node.target.attr] = _classes(ast.unparse(node.annotation), namespace)
            elif isinstance(node, ast.Assign):
                for target, value in _pairs(node):
                    if _is_self_attribute(target) and (kinds := scope.infer(value)):
                        found[target.attr] = kinds
    return found


def _is_self_attribute(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _pairs(node: ast.Assign) -> list[tuple[ast.expr, ast.expr]]:
    """Each name assigned with its value (``a, b = x, y``: both)."""
    pairs = []
    for target in node.targets:
        if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
            pairs += zip(target.elts, node.value.elts)
        else:
            pairs.append((target, node.value))
    return pairs


def _member(cls: type, name: str) -> Any:
    return next((klass.__dict__[name] for klass in cls.__mro__ if name in klass.__dict__), None)


class _Scope:
    """One function's names, and what each may be."""

    def __init__(self, function, names: dict[str, list], owner: type | None):
        self.function, self.names, self.owner = function, names, owner

    def infer(self, node: ast.AST) -> list:
        """What ``node`` may evaluate to: classes (for their instances), ``_Value``s, ``_Method``s."""
        if isinstance(node, ast.Await):
            return self.infer(node.value)
        if isinstance(node, ast.IfExp):
            return self.infer(node.body) + self.infer(node.orelse)
        if isinstance(node, ast.Name):
            if node.id == "self" and self.owner is not None:
                return [self.owner]
            if node.id in self.names:
                return self.names[node.id]
            value = self.function.__globals__.get(node.id)
            return [] if value is None else [_Value(value)]
        if isinstance(node, ast.Attribute):
            return [found for base in self.infer(node.value) for found in self._attribute(base, node.attr)]
        if isinstance(node, ast.Call):  # an instance of a class called
            return [t.value for t in self.infer(node.func) if isinstance(t, _Value) and isinstance(t.value, type)]
        return []

    @staticmethod
    def _attribute(base: Any, name: str) -> list:
        if isinstance(base, _Value):
            value = getattr(base.value, name, None)
            return [] if value is None else [_Value(value)]
        if not isinstance(base, type):
            return []
        if kinds := _attributes(base).get(name):
            return kinds
        member = _member(base, name)
        if isinstance(member, property) and member.fget is not None:
            return _classes(member.fget.__annotations__.get("return"), member.fget.__globals__)
        return [] if member is None else [_Method(base, member)]

    def local_names(self, tree: ast.AST) -> None:
        """The function's own names, as far as their assignments tell (twice: one may use another)."""
        for _ in range(2):
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign):
                    for target, value in _pairs(node):
                        if isinstance(target, ast.Name):
                            self.names[target.id] = [*self.names.get(target.id, []), *self.infer(value)]


@dataclass
class Reach:
    """What one call's code can answer."""
    statuses: set[int] = field(default_factory=set)
    store: bool = False  # it reads or writes the database
    read: set = field(default_factory=set)  # the functions read, with the class each was a method of


@functools.cache
def _read(function, owner: type | None) -> tuple[frozenset[int], tuple[tuple[Any, type | None], ...]]:
    """The statuses ``function`` makes itself, and the functions of ours it calls."""
    tree = _tree(function)
    if tree is None:
        return frozenset(), ()
    scope = _Scope(function, _parameters(function), owner)
    scope.local_names(tree)
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    statuses, steps = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            named = node.func
        elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load) and id(node) not in called:
            named = node  # a function passed on: it may be called
        else:
            continue
        for target in scope.infer(named):
            if isinstance(target, _Value) and target.value is APIError and isinstance(node, ast.Call):
                status = node.args[0] if node.args else None
                if isinstance(status, ast.Constant) and isinstance(status.value, int):
                    statuses.add(status.value)
            elif isinstance(target, _Value) and _ours(target.value) and inspect.isfunction(target.value):
                steps.append((target.value, None))
            elif isinstance(target, _Value) and _ours(target.value) and isinstance(node, ast.Call):  # a class made
                init = _member(target.value, "__init__")
                if inspect.isfunction(init) and _ours(init):
                    steps.append((init, target.value))
            elif isinstance(target, _Method):
                method = target.function
                method = method.__func__ if isinstance(method, (staticmethod, classmethod)) else method
                if inspect.isfunction(method) and _ours(method):
                    steps.append((method, target.owner))
    return frozenset(statuses), tuple(steps)


def reach(*functions) -> Reach:
    """What ``functions`` (a call's ``run``, its ``ready``...) and what they call can answer."""
    found = Reach()
    todo = [(function, None) for function in functions if function is not None]
    while todo:
        function, owner = todo.pop()
        if (function, owner) in found.read:
            continue
        found.read.add((function, owner))
        found.store |= function.__module__.startswith(STORE)
        statuses, steps = _read(function, owner)
        found.statuses |= statuses
        todo += steps
    return found
