"""The public plugin API: everything a plugin may use, and nothing else.

    from device_loop.plugin import hookimpl, Health, Resource, Service

A plugin imports this module and no other of device-loop's; ``tests/test_plugin_api.py``
pins the names below, so removing or renaming one is a deliberate, visible change (and a
new ``API_VERSION``). ``docs/plugins.md`` describes each.
"""
from device_loop.core import POWER_KIND
from device_loop.core.hookspecs import API_VERSION, hookimpl
from device_loop.core.container_env import ContainerEnvironment, DeviceNode, Mount, device_node, tty_environment
from device_loop.core.disk_images import DiskFormat, disk_format, disk_problem
from device_loop.core.durations import parse_duration
from device_loop.core.host import HostContext
from device_loop.core.plugin_config import Duration, PluginConfig
from device_loop.core.model import (ConfiguredResource, Endpoint, FlashError, FlashImage, Health, LeaseRef, Operation,
                                    OperationError, OperationKind, PowerReading, Resource, Service, ServiceError,
                                    StepKind)
from device_loop.core.holders import command_of, holders
from device_loop.core.ports import inherited_listener, port_is_free, wait_port_free, wait_port_open
from device_loop.core.process import find_program, last_lines, python_module, run
from device_loop.core.serial_bridge import CONSOLE_COMMAND, parse_framing, start_bridge
from device_loop.core.ssh_keys import LOGIN_NAME_PATTERN, pinned_host_key, public_host_key
from device_loop.core.tcp_relay import start_relay
from device_loop.core.usb import UsbDevice, UsbTty, usb_devices, usb_ttys
from device_loop.core.vocabulary import EndpointRole, Fidelity, HealthKind, Purpose


__all__ = [
    "API_VERSION",
    # the hooks: implement them with @hookimpl (the contract is device_loop.core.hookspecs)
    "hookimpl",
    # what hooks are handed and return
    "ConfiguredResource", "Endpoint", "Health", "HostContext", "LeaseRef", "Resource", "Service", "ServiceError",
    # operations: what devloop_operations declares, devloop_operate is handed and raises
    # (FlashError is OperationError's old name; FlashImage, an image an operation writes)
    "Operation", "OperationError", "OperationKind", "FlashError", "FlashImage",
    # why an operation runs (Operation.purpose): in a lease, a step between two, a recovery
    "Purpose",
    # steps between leases: what devloop_steps declares (run through devloop_operate)
    "StepKind",
    # a fault that may pass by itself or needs a person (Health.kind)
    "HealthKind",
    # what a container needs of a resource (devloop_environment): nodes read from the node itself
    "ContainerEnvironment", "DeviceNode", "Mount", "device_node", "tty_environment",
    # power backends: what devloop_power returns, and the kind of their resources
    "PowerReading", "POWER_KIND",
    # what an endpoint is for; what a resource is a part of (a board, a simulation, a VM, an emulator)
    "EndpointRole", "Fidelity",
    # services, ready-made: a serial device as raw TCP or RFC 2217, a TCP relay
    "CONSOLE_COMMAND", "parse_framing", "start_bridge", "start_relay",
    # config entries: the base of a plugin's model (devloop_config_model); values as people write them: 90s, 10m
    "PluginConfig", "Duration", "parse_duration",
    # ports and programs
    "inherited_listener", "port_is_free", "python_module", "run", "wait_port_free", "wait_port_open",
    # programs: one found on PATH or in the sbin folders; what an error quotes of its output
    "find_program", "last_lines",
    # a disk image's format from its own bytes, and whether it names a file of the host (a qcow2's backing file)
    "DiskFormat", "disk_format", "disk_problem",
    # USB facts from sysfs (read-only, for discovery)
    "UsbDevice", "UsbTty", "usb_devices", "usb_ttys",
    # who has a device node open, from /proc (spawns nothing, opens nothing)
    "command_of", "holders",
    # a board's ssh host key, as its .pub file has it (checked, its comment left out), and a login name
    "public_host_key", "pinned_host_key", "LOGIN_NAME_PATTERN",
]
