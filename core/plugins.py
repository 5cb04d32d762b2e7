"""Loading plugins: built-ins by module, third parties by the ``device_loop`` entry points."""
from __future__ import annotations

import importlib

import pluggy

from . import hookspecs
from .hookspecs import PROJECT, hookimpl

BUILTIN_PLUGINS = ("sim", "uart", "adb", "video", "vnc", "flash")
ENTRY_POINT_GROUP = "device_loop"


class _Defaults:
    """Fallbacks for hooks a plugin may leave out (registered last, like pytest's)."""

    @hookimpl(trylast=True)
    def devloop_stop(self, service):
        for proc in service.processes:
            proc.stop()
        return True


class PluginSet:
    """The plugins one exporter may use, each callable on its own."""

    def __init__(self, enable: list[str] | None = None, disable: list[str] = ()):
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(hookspecs)
        for name in disable:
            self.pm.set_blocked(name)
        for name in BUILTIN_PLUGINS:
            if not self.pm.is_blocked(name):
                self.pm.register(importlib.import_module(f"device_loop.plugins.{name}"), name=name)
        self.pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        if enable is not None:
            for name, plugin in self._registered():
                if name not in enable:
                    self.pm.unregister(plugin)
        self.pm.register(_Defaults(), name="defaults")

    def _registered(self) -> list[tuple[str, object]]:
        return [(name, p) for name, p in self.pm.list_name_plugin() if p is not None]

    def names(self) -> list[str]:
        return [name for name, _ in self._registered() if name != "defaults"]

    def call(self, plugin: str, hook: str, **kwargs):
        """Call ``hook`` of one plugin (with the defaults as fallback)."""
        others = [p for name, p in self._registered() if name not in (plugin, "defaults")]
        return self.pm.subset_hook_caller(hook, remove_plugins=others)(**kwargs)

    def unregister(self, plugin: str) -> None:
        self.pm.unregister(name=plugin)
