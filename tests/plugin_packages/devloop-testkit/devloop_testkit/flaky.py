"""``flaky``: a plugin whose hooks fail on demand (the test sets its attributes); its
service is a real process."""
import dataclasses
import sys
import threading

from device_loop.plugin import PluginConfig, hookimpl


class FlakyConfig(PluginConfig):
    startup_fails: bool = False


class Flaky:
    def __init__(self):
        self.discover_fails = self.stop_fails = self.start_fails_after_spawn = self.startup_fails = False
        self.endpoint_fields = {}  # what its service's endpoints say, besides where they are
        self.stop_gate: threading.Event | None = None  # a stop waits until the test sets it

    @hookimpl
    def devloop_config_model(self):
        return FlakyConfig

    @hookimpl
    def devloop_startup(self, host):
        if self.startup_fails or any(e.config.startup_fails for e in host.entries):
            raise OSError("cannot open /dev/flaky")

    @hookimpl
    def devloop_discover(self, host):
        if self.discover_fails:
            raise OSError("sysfs read failed")
        return [e.resource("uart", f"flaky:{e.device}") for e in host.entries]

    @hookimpl
    def devloop_start(self, host, resource, lease):
        service = host.serve_on_free_port([sys.executable, "-c", "import time; time.sleep(60)"], resource, lease,
                                          name="flaky")
        if self.start_fails_after_spawn:
            raise RuntimeError("helper did not answer")
        service.endpoints = [dataclasses.replace(e, **self.endpoint_fields) for e in service.endpoints]
        return service

    @hookimpl
    def devloop_stop(self, host, service):
        if self.stop_fails:
            raise RuntimeError("stop hook broke")
        if self.stop_gate is not None:
            self.stop_gate.wait()
        return None  # fall through to the default: stop the processes
