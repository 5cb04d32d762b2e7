"""Commands loaded only when they run, and their line in ``device-loop --help`` read from
their module's source, so that listing them imports none of them: a server's or a job's
stack costs a second to import, and ``--help`` needs only their docstrings.

Each command is a module-level function decorated with ``@click.command`` or
``@click.group``; its help is its docstring (or the decorator's ``help=``), and its short
help the decorator's ``short_help=``, else the docstring shortened as click shortens it.
"""
from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path

import click

PACKAGE = Path(__file__).resolve().parent.parent  # the folder that holds cli/, client/, coordinator/ ...


def load(target: str) -> click.Command:
    """The command at ``target`` (``device_loop.cli.console:console_command``), imported."""
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def stand_in(name: str, target: str) -> click.Command:
    """A command that only tells what the command at ``target`` says of itself in a list of
    commands (its help and short help), read from its source without importing it."""
    module, attr = target.split(":")
    function = _functions(module)[attr]
    said: dict[str, str] = {
        keyword.arg: keyword.value.value for decorator in function.decorator_list if isinstance(decorator, ast.Call)
        and _makes_command(decorator) for keyword in decorator.keywords
        if keyword.arg in ("help", "short_help") and isinstance(keyword.value, ast.Constant)
        and isinstance(keyword.value.value, str)}
    return click.Command(name, help=said.get("help") or ast.get_docstring(function), short_help=said.get("short_help"))


@functools.cache
def _functions(module: str) -> dict[str, ast.FunctionDef]:
    """The functions a module of ours defines at its top level, parsed (not imported)."""
    source = PACKAGE.joinpath(*module.split(".")[1:]).with_suffix(".py")
    tree = ast.parse(source.read_text(), str(source))
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def _makes_command(decorator: ast.Call) -> bool:
    """``@click.command(...)`` or ``@click.group(...)`` (not an option's ``help=``)."""
    called = decorator.func
    return (called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")) in ("command", "group")
