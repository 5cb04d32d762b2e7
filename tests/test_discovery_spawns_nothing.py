"""Watching must not change what is watched: discovery and health spawn no process."""
import contextlib
import subprocess
import sys

import pytest

from device_loop.core.hookspecs import hookimpl
from device_loop.exporter.config import parse_config
from device_loop.exporter.daemon import Exporter

pytestmark = pytest.mark.timeout(30)

SPAWN_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.forkpty", "os.spawn")
_watching = []
_spawned = []


def _audit(event, args):
    if _watching and event in SPAWN_EVENTS:
        _spawned.append((event, args))


sys.addaudithook(_audit)  # audit hooks cannot be removed: it only records while watching


@contextlib.contextmanager
def no_process_may_start():
    _spawned.clear()
    _watching.append(True)
    try:
        yield _spawned
    finally:
        _watching.pop()


def make_exporter(tmp_path, extra_plugin=None):
    config = parse_config({
        "exporter": {"name": "host-a", "state_dir": str(tmp_path / "state"), "sysfs_root": str(tmp_path / "sys")},
        "devices": [{"name": "sim-board-0", "plugin": "sim"}, {"name": "sim-board-1", "plugin": "sim"}],
    })
    exporter = Exporter(config)
    if extra_plugin is not None:
        exporter.plugins.pm.register(extra_plugin, name="spawner")
    exporter.setup()
    return exporter


def test_discovery_and_health_spawn_no_process(tmp_path):
    exporter = make_exporter(tmp_path)
    try:
        with no_process_may_start() as spawned:
            resources = exporter.discover()
            report = exporter.report(resources)
        assert {r.device for r in resources} == {"sim-board-0", "sim-board-1"}
        assert all(res["health"] == "ok" for d in report["devices"] for res in d["resources"])
        assert spawned == []
    finally:
        exporter.shutdown()


class SpawningPlugin:
    """What the guard exists to catch: a plugin that runs a tool to look."""

    @hookimpl
    def devloop_available(self, host):
        return None

    @hookimpl
    def devloop_discover(self, host):
        subprocess.run(["true"], check=True)
        return []


def test_the_guard_catches_a_plugin_that_spawns(tmp_path):
    exporter = make_exporter(tmp_path, SpawningPlugin())
    try:
        assert "spawner" in exporter.loaded
        with no_process_may_start() as spawned:
            exporter.discover()
        assert [event for event, _ in spawned] == ["subprocess.Popen"]
    finally:
        exporter.shutdown()
