"""Shared mechanics of device-loop: the plugin contract, data model, processes, ports."""
from .vocabulary import LIVE_LEASE_STATES, LIVE_OP_STATES  # noqa: F401 (the vocabulary, written once)

#: Heartbeat protocol spoken between exporter and coordinator (``core/protocol.py``).
#: Bump on an incompatible change; a coordinator refuses exporters of another version.
# 4: an operation's purpose (DesiredOperation.purpose), its report's interrupted flag, a device's fidelity;
# 3: the steps a device runs between two leases (DeviceReport.steps), a progress detail;
# 2: operations of any kind (one carrier), endpoint roles, resources that serve no lease
PROTOCOL_VERSION = 4
#: Device, host and user names: letters, digits, ``.``, ``_``, ``-``; at most 64 characters.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
#: Lease ids start with this; device names may not, so a name never reads as a lease.
LEASE_PREFIX = "lease-"

#: The resource kind of flash targets, and the operation kind that writes an image to one.
FLASH_KIND = "flash"
#: The resource kind of power switches, and the operation kind that switches one (docs/architecture.md, "Power").
POWER_KIND = "power"
#: The operation that runs a device's steps that settle, inside a lease (docs/architecture.md, "Steps between
#: leases"): the exporter's own, never a plugin's.
SETTLE_KIND = "settle"
#: The step between leases that writes the latest known-good image back: the coordinator asks for it as a flash
#: (its exporter's model of it: ``exporter/config.ReflashStep``).
REFLASH_STEP = "reflash"
#: The operation an admin asks for to have a device's exporter kill the processes that still hold its node after
#: its lease ended (docs/architecture.md, "Containers and CDI"): the exporter's own, never a plugin's.
ORPHANS_KIND = "kill-orphans"
#: Operation ids start with this.
OP_PREFIX = "op-"
#: Where the coordinator's REST API lives: every route of its call table is under it (``coordinator/api.py``),
#: and the client and the exporter ask there.
API_PREFIX = "/api/v1"
#: A coordinator in the trust mode (``device-loop up``) answers a request that carried a token with this header:
#: the token was not used (every local caller is the lab's owner), and the client says so.
TOKEN_IGNORED_HEADER = "X-Device-Loop-Token-Ignored"
#: The event stream (``GET /api/v1/events``) sends at least a keepalive this often.
EVENTS_KEEPALIVE_S = 15.0


def __getattr__(name: str) -> str:
    # __version__ is looked up when asked for: importlib.metadata costs a short command
    # like `device-loop ls` 13 ms of its start
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("device-loop")
        except PackageNotFoundError:  # running from a source tree that was never installed
            return "0.0.0"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
