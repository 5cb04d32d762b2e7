"""Power switches: a device's power, switched on, off (and, by the exporter, cycled) and
read back through one of six backends.

Config: a ``[[devices.resources]]`` entry with ``plugin = "power"``, ``backend = NAME`` and
that backend's keys (a key of another backend is refused, by name):

- ``pdudaemon``: an outlet of a PDU that pdudaemon drives, through its HTTP listener:
  ``host`` (default ``127.0.0.1``), ``port`` (16421), ``pdu`` (its name in pdudaemon's
  config), ``outlet`` (a number from 0, or a name). pdudaemon cannot read an outlet back.
- ``uhubctl``: a port of a USB hub that switches its ports' power: ``location`` (the hub,
  as uhubctl names it: ``1-1``), ``port`` (a number). Read back from uhubctl's port line.
- ``ipmi``: a BMC, with ipmitool: ``host``, ``port`` (623), ``user``, ``password_file``
  (read by ipmitool, ``-f``: the password is never on an argument list), ``interface``
  (``lanplus``, or ``lan``), ``cipher_suite`` (3, lanplus only). Read back with
  ``chassis power status``.
- ``redfish``: a Redfish service: ``url`` (its root, ``https://bmc:443``), ``system`` (the
  ComputerSystem's id or name, or its path), ``user`` and ``password_file`` (HTTP basic
  auth; both or neither), ``on_reset_type`` (``On``), ``off_reset_type`` (``ForceOff``),
  ``verify_tls`` (true). Switched with its ``ComputerSystem.Reset`` action (a type it does
  not allow is refused, naming those it does), read back by polling ``PowerState``. A path the
  service names (a member's ``@odata.id``, the action's ``target``) is followed only when it
  is a path, or a URL of the configured ``url``'s scheme, host and port: the credentials go
  nowhere else (a redirect is followed on the same terms).
- ``command``: ``on`` and ``off`` (argument lists, run without a shell; ``{device}`` is
  filled in), optionally ``status`` (one whose output's first word, ``on`` or ``off``, is
  the state).
- ``sim``: a simulated board's switch file, ``switch`` (default
  ``STATE_DIR/sim/DEVICE.power``): ``on`` or ``off`` is written to it; the board answers in
  ``SWITCH.state``.

Every backend takes ``off_time`` (a cycle's default off-time: pdudaemon, ipmi and redfish
5s, the others 2s), ``timeout`` (how long one call may take, 30s: a program past it is
killed with all it forked; an HTTP call, its answer's last byte included, is given up at it,
however slowly the server answers: ``web.py``) and
``console_timeout`` (how long after power-on the console may stay silent, 20s). The
switch is a resource of kind ``power`` that serves no lease; the exporter runs its power
operations through ``devloop_power``. Health spawns nothing: a missing password file or a
program not installed is ``failed``.
"""
from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import os

from device_loop.plugin import (POWER_KIND, Health, HostContext, OperationError, PluginConfig, PowerReading, Resource,
                                find_program, hookimpl)

from .config import BACKENDS, PowerConfig

#: What a backend is asked: exactly ``on``, ``off`` and ``status``, the values of the core's
#: ``PowerAction.ON``, ``OFF`` and ``STATUS``, spelled here because a plugin imports nothing of
#: device-loop's but ``device_loop.plugin``, which does not export ``PowerAction``. ``cycle`` is
#: not one: a cycle is the exporter's (off, the off-time, on, then the console watched for the
#: boot), made of these three, the same for every backend, one that cannot read back included.
ACTIONS = ("on", "off", "status")


@hookimpl
def devloop_available(host: HostContext) -> str | None:
    return None  # each backend's program is checked by its resources' health


@hookimpl
def devloop_config_model() -> type[PluginConfig] | None:
    return PowerConfig


@hookimpl
def devloop_discover(host: HostContext) -> Sequence[Resource] | None:
    return [dataclasses.replace(entry.resource(POWER_KIND, f"power:{host.name}:{entry.device}"), serves_lease=False)
            for entry in host.entries]


@hookimpl
def devloop_health(host: HostContext, resource: Resource) -> Health | None:
    """Whether the switch can be used, from what is here (files, programs): spawns nothing."""
    if resource.kind != POWER_KIND:
        return None
    config = resource.config.settings
    for program in config.programs(resource.device):
        if find_program(program) is None:
            return Health("failed", f"{program} is not installed here (not on PATH)")
    if getattr(config, "password_file", None) is not None:
        if not os.path.isfile(config.password_file):
            return Health("failed", f"the BMC's password file {config.password_file} does not exist")
        if not os.access(config.password_file, os.R_OK):
            return Health("failed", f"the BMC's password file {config.password_file} is not readable by the "
                                    "exporter")
    return Health("ok")


@hookimpl
def devloop_power(host: HostContext, resource: Resource, action: str) -> PowerReading | None:
    """Switch ``resource``'s device on or off, or read its state, with its backend."""
    if resource.kind != POWER_KIND:
        return None
    if action not in ACTIONS:
        raise OperationError(f"a power switch does {', '.join(ACTIONS)}, not {action!r}", changed=False)
    return BACKENDS[resource.config.backend].power(host, resource, action)
