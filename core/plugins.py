"""Loading plugins: every plugin, built-in or installed with pip, through the ``device_loop``
entry points. An entry point names a module of ``@hookimpl`` functions, or a class whose
methods are the hooks: each exporter then gets an object of its own, which holds the
plugin's state.

Loading is fault-isolated. Which plugins to load is decided before anything is imported
(``[plugins] enable/disable`` in the exporter config, and ``DEVICE_LOOP_LOAD_PLUGINS``),
so an uninstallable package that is not wanted is never touched. A plugin that fails to
import, marks a function as a hook that does not exist (``devloop_discovr``), or has a
``devloop_`` function without ``@hookimpl`` is skipped with the reason, and the others load.
A plugin that needs a newer plugin API (its ``DEVLOOP_API_VERSION``) is skipped saying
which version this exporter lacks, before its hooks are looked at (they may be new ones).
"""
from __future__ import annotations

import os
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Sequence

import pluggy

from . import hookspecs
from .hookspecs import API_VERSION, NEEDS_API, PROJECT, hookimpl
from .plugin_config import PluginConfig

if TYPE_CHECKING:
    from .model import Service

ENTRY_POINT_GROUP = "device_loop"
#: A comma-separated list of the plugins to load (all installed ones when unset), as
#: datasette's DATASETTE_LOAD_PLUGINS: a test suite or a trial run loads what it names.
LOAD_ENV = "DEVICE_LOOP_LOAD_PLUGINS"
HOOKS = frozenset(name for name in dir(hookspecs) if name.startswith("devloop_"))


class _Defaults:
    """Fallbacks for hooks a plugin may leave out (registered last, like pytest's)."""

    @hookimpl(trylast=True)
    def devloop_stop(self, service: Service) -> object:
        for proc in service.processes:
            proc.stop()
        return True

    @hookimpl(trylast=True)
    def devloop_config_model(self) -> type[PluginConfig]:
        return PluginConfig  # a plugin that declares no model takes no keys


def wanted_by_environment() -> set[str] | None:
    value = os.environ.get(LOAD_ENV)
    return None if value is None else {name.strip() for name in value.split(",") if name.strip()}


def model_problem(model: object) -> str | None:
    """What is wrong with what a plugin's ``devloop_config_model`` returned, or None."""
    if not (isinstance(model, type) and issubclass(model, PluginConfig)):
        return f"devloop_config_model returned {model!r}, not a subclass of PluginConfig"
    if model.model_config.get("extra") != "forbid":
        return f"its config model {model.__name__} lets unknown keys in (extra must stay \"forbid\")"
    return None


def api_problem(plugin: object) -> str | None:
    """Why a plugin cannot load here because it needs a newer plugin API than this
    exporter's (its ``DEVLOOP_API_VERSION``), or None."""
    needed = getattr(plugin, NEEDS_API, None)
    if needed is None:
        return None
    if not isinstance(needed, int) or isinstance(needed, bool) or needed < 1:
        return f"its {NEEDS_API} is {needed!r}, not a version number"
    if needed > API_VERSION:
        lacking = ", ".join(str(version) for version in range(API_VERSION + 1, needed + 1))
        return (f"it needs device-loop's plugin API {needed}, and this exporter has API {API_VERSION}: it lacks "
                f"version{'s' if needed - API_VERSION > 1 else ''} {lacking} (upgrade device-loop on this host)")
    return None


def hook_problems(plugin: object) -> list[str]:
    """What is wrong with a plugin's hooks that pluggy would let pass in silence."""
    problems = []
    for name in dir(plugin):
        value = getattr(plugin, name, None)
        marked = hasattr(value, f"{PROJECT}_impl")
        if (marked or name.startswith("devloop_") and callable(value)) and name not in HOOKS:
            problems.append(f"{name} is not a device-loop hook (a typo? hooks: {', '.join(sorted(HOOKS))})")
        elif name in HOOKS and not marked:
            problems.append(f"{name} lacks @hookimpl, so it would never be called")
    return problems


class PluginSet:
    """The plugins one exporter may use, each callable on its own; ``skipped`` says which
    were not loaded, and why."""

    def __init__(self, enable: list[str] | None = None, disable: Sequence[str] = ()):
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.skipped: list[dict] = []
        from_environment = wanted_by_environment()
        for entry in entry_points(group=ENTRY_POINT_GROUP):
            if self.pm.has_plugin(entry.name) or any(s["name"] == entry.name for s in self.skipped):
                continue  # the first package to claim a name has it
            if enable is not None and entry.name not in enable or entry.name in disable:
                continue  # not wanted here: never imported
            if from_environment is not None and entry.name not in from_environment:
                continue
            self._load(entry)
        self.pm.register(_Defaults(), name="defaults")

    def _load(self, entry: EntryPoint) -> None:
        try:
            plugin = entry.load()
            if isinstance(plugin, type):  # a plugin class: this exporter's own object keeps its state
                plugin = plugin()
        except Exception as exc:  # an import error, a syntax error, a missing dependency...
            self.skipped.append({"name": entry.name, "reason": f"cannot import {entry.value}: {exc!r}"})
            return
        problems = [problem] if (problem := api_problem(plugin)) else hook_problems(plugin)
        if problems:
            self.skipped.append({"name": entry.name, "reason": "; ".join(problems)})
            return
        try:
            self.pm.register(plugin, name=entry.name)
        except Exception as exc:  # pluggy refuses a hook whose arguments the spec does not have
            self.skipped.append({"name": entry.name, "reason": f"invalid hook: {exc}"})

    def _registered(self) -> list[tuple[str, object]]:
        return [(name, p) for name, p in self.pm.list_name_plugin() if p is not None]

    def names(self) -> list[str]:
        return [name for name, _ in self._registered() if name != "defaults"]

    def call(self, plugin: str, hook: str, **kwargs: Any) -> Any:
        """Call ``hook`` of one plugin (with the defaults as fallback). The ``host`` it is
        handed becomes that plugin's view of it, with its own config entries alone."""
        if "host" in kwargs:
            kwargs["host"] = kwargs["host"].for_plugin(plugin)
        others = [p for name, p in self._registered() if name not in (plugin, "defaults")]
        return self.pm.subset_hook_caller(hook, remove_plugins=others)(**kwargs)

    def config_models(self) -> dict[str, type[PluginConfig]]:
        """The model of each loaded plugin's config entries (``devloop_config_model``). A
        plugin whose answer is not a ``PluginConfig`` that refuses unknown keys is skipped
        with the reason, as one that fails to import is: its entries cannot be checked."""
        models = {}
        for name in self.names():
            try:
                model = self.call(name, "devloop_config_model")
                problem = model_problem(model)
            except Exception as exc:
                problem = f"devloop_config_model crashed: {exc!r}"
            if problem:
                self.skipped.append({"name": name, "reason": problem})
                self.unregister(name)
            else:
                models[name] = model
        return models

    def implements(self, plugin: str, hook: str) -> bool:
        """Whether ``plugin`` is loaded and has ``hook`` itself (not by a fallback)."""
        return any(impl.plugin_name == plugin for impl in getattr(self.pm.hook, hook).get_hookimpls())

    def unregister(self, plugin: str) -> None:
        self.pm.unregister(name=plugin)
