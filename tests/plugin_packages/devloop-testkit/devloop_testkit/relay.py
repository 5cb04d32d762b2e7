"""``relay``: a 'power' plugin that switches a relay (a file in the entry's ``switch_dir``)
on for a lease, off when it ends."""
import os
import sys
from pathlib import Path

from device_loop.plugin import PluginConfig, hookimpl


class RelayConfig(PluginConfig):
    relay_serial: str | None = None  # missing: said by devloop_check_config, as a plugin may say what no model can
    switch_dir: str | None = None


class Relay:
    @hookimpl
    def devloop_config_model(self):
        return RelayConfig

    @hookimpl
    def devloop_discover(self, host):
        return [e.resource("power", f"relay:{e.device}") for e in host.entries if e.config.relay_serial]

    @hookimpl
    def devloop_check_config(self, entry):
        return None if entry.config.relay_serial else "relay_serial is missing"

    @hookimpl
    def devloop_start(self, host, resource, lease):
        switch = Path(resource.config.switch_dir) / f"{resource.device}.on"
        switch.touch()
        service = host.serve_on_free_port([sys.executable, "-c", "import time; time.sleep(60)"], resource, lease,
                                          name="relay")
        service.data["switch"] = str(switch)
        return service

    @hookimpl
    def devloop_stop(self, host, service):
        os.unlink(service.data["switch"])

    @hookimpl
    def devloop_cleanup(self, host, data):
        os.unlink(data["switch"])
