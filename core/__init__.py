"""Shared mechanics of device-loop: the plugin contract, data model, processes, ports."""

#: Heartbeat protocol spoken between exporter and coordinator (``core/protocol.py``).
#: Bump on an incompatible change; a coordinator refuses exporters of another version.
PROTOCOL_VERSION = 1
#: Device, host and user names: letters, digits, ``.``, ``_``, ``-``; at most 64 characters.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
#: Lease ids start with this; device names may not, so a name never reads as a lease.
LEASE_PREFIX = "lease-"
#: A lease in these states is live (it holds its device); every other state is final.
LIVE_LEASE_STATES = ("pending", "active")
#: The one resource kind the coordinator mediates (DESIGN §6): a flash target is never
#: served to a lease holder; it is written only through a flash operation.
FLASH_KIND = "flash"
#: Flash operation ids start with this.
OP_PREFIX = "op-"
#: A flash operation in these states is live (a device has one at most); then done or failed.
LIVE_OP_STATES = ("queued", "running")
#: The phases of a flash in which its target is being changed: a flash that fails in one
#: of them leaves the device needing recovery.
WRITING_PHASES = ("writing", "verifying")
#: The event stream (``GET /api/v1/events``) sends at least a keepalive this often.
EVENTS_KEEPALIVE_S = 15.0


def __getattr__(name: str):
    # __version__ is looked up when asked for: importlib.metadata costs a short command
    # like `device-loop ls` 13 ms of its start
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("device-loop")
        except PackageNotFoundError:  # running from a source tree that was never installed
            return "0.0.0"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
