"""Shared mechanics of device-loop: the plugin contract, data model, processes, ports."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("device-loop")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

#: Heartbeat protocol spoken between exporter and coordinator. Bump on incompatible change.
PROTOCOL_VERSION = 1
