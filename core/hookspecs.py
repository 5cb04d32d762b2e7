"""The plugin contract: every hook an exporter plugin may implement.

A plugin is a plain module with ``@hookimpl`` functions that imports ``device_loop.plugin``
and nothing else of ours (see ``docs/plugins.md``). The exporter calls each hook *per
plugin*: a plugin only ever sees the resources it discovered itself, so no hook needs to
check whose resource it was handed. Every hook is ``firstresult``: the plugin's own
answer is the answer, and each docstring says what an answer of ``None`` means. A hook
that raises is that plugin's failure alone: the exporter logs it and goes on (a
``devloop_available`` or ``devloop_startup`` that raises skips the plugin, with the
error as the reason).

A plugin written for a newer exporter says so: ``DEVLOOP_API_VERSION = 3`` in its module
(or on its class) is the ``API_VERSION`` it needs, and an exporter whose API is older
skips it, saying which version it lacks, before looking at its hooks.

The hooks are typed as pytest types its own: what each is handed and what it may answer.
mypy holds the built-in plugins' hooks to these (tests/test_static_checks.py).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:  # (hookspecs are loaded by every exporter and its service processes: nothing heavy at run time)
    from .container_env import ContainerEnvironment
    from .host import HostContext
    from .model import (ConfiguredResource, Health, LeaseRef, Operation, OperationKind, PowerReading, Resource,
                        Service, StepKind)
    from .plugin_config import PluginConfig

PROJECT = "device_loop"

#: The plugin API's version (``device_loop.plugin``), bumped when a name of it goes away or
#: changes meaning. 2: ``devloop_flash`` became the ``flash`` kind of ``devloop_operate``;
#: endpoints have a ``role``; config entries are parsed by the plugin's ``PluginConfig``
#: model and found in ``host.entries`` (not ``host.configured(name)``), ``entry.config``
#: and ``resource.config`` being that model. Additions keep it: ``StepKind``
#: (``devloop_steps``), ``devloop_thermal``, ``op.progress``'s ``detail``,
#: ``devloop_fingerprint``, ``EndpointRole.SSH``, ``devloop_power`` with ``PowerReading``
#: and ``POWER_KIND``, ``find_program``, ``last_lines``, ``public_host_key``,
#: ``LOGIN_NAME_PATTERN``, ``Fidelity`` (``Resource.fidelity``), a plugin's
#: ``DEVLOOP_API_VERSION``, ``devloop_metrics``, ``Health.kind`` (``HealthKind``),
#: ``devloop_environment`` (``ContainerEnvironment``, ``DeviceNode``, ``Mount``, ``device_node``,
#: ``tty_environment``), ``Operation.purpose`` (``Purpose``), ``disk_format``, ``disk_problem``
#: (``DiskFormat``).
API_VERSION = 2
#: What a plugin names (on its module or class) to say which ``API_VERSION`` it needs.
NEEDS_API = "DEVLOOP_API_VERSION"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec(firstresult=True)
def devloop_available(host: HostContext) -> str | None:
    """Say whether this host has what the plugin needs (a binary, a kernel interface).

    Return ``None`` when the plugin can run here, or a short reason string when it
    cannot ("ser2net not installed"). The exporter loads only available plugins and
    reports the skipped ones with their reasons. Must be cheap and spawn no process.
    """


@hookspec(firstresult=True)
def devloop_startup(host: HostContext) -> None:
    """Prepare what discovery will look at, once, when the exporter starts.

    Most plugins do not need this. The simulated boards use it to power on their
    consoles. Whatever is created here is torn down in ``devloop_shutdown``. The result
    is ignored; raise to be skipped (the message is the reason ``hosts`` shows).
    """


@hookspec(firstresult=True)
def devloop_shutdown(host: HostContext) -> None:
    """Undo ``devloop_startup`` when the exporter stops. The result is ignored."""


@hookspec(firstresult=True)
def devloop_config_model() -> type[PluginConfig] | None:
    """Return the model of this plugin's config entries: a subclass of
    :class:`PluginConfig` (the class, not an object).

    The exporter parses each ``[[devices.resources]]`` entry that names the plugin with it
    when it loads its config, and refuses to start on an unknown key or a bad value, naming
    the file, the entry and the key. Hooks then find the parsed entries in
    ``host.entries`` (``entry.config``). Without this hook a plugin takes no keys.
    """


@hookspec(firstresult=True)
def devloop_check_config(host: HostContext, entry: ConfiguredResource) -> str | None:
    """Say why one of this plugin's config entries (a :class:`ConfiguredResource`, which
    its model accepted) was not found, or ``None`` for "not plugged in, or a typo".

    Asked for an entry the plugin's discovery did not find, for what a model cannot tell
    without looking at the host ("no USB adapter with serial A10K3XYZ is plugged in"):
    ``device-loop hosts`` shows the reason. Read-only, like discovery.
    """


@hookspec(firstresult=True)
def devloop_discover(host: HostContext) -> Sequence[Resource] | None:
    """Return the resources of this plugin's kind present on this host.

    A list of :class:`Resource` (``None`` means none). Read-only: look at sysfs (under
    ``host.sysfs_root``), the plugin's config entries (``host.entries``) and files, never spawn a
    process, never open a device (opening a UART toggles DTR and resets boards); a test
    fails if a built-in does. Identifiers must be stable across replugs and reboots (USB
    serial, MAC, ...). A discovery that raises keeps the plugin's last good result: a
    failure to look is not evidence that the devices are gone.
    """


@hookspec(firstresult=True)
def devloop_health(host: HostContext, resource: Resource) -> Health | None:
    """Cheap, periodic health check of one resource.

    Return a :class:`Health` (``ok``, ``degraded`` or ``failed`` with a reason; the
    worst of a device's resources is its health, and ``failed`` makes it ``faulty`` with
    the reason in its log). ``None``, or no such hook, means ``ok`` while discovered; a
    check that raises means ``failed``, with the error. Must not open the device.
    """


@hookspec(firstresult=True)
def devloop_start(host: HostContext, resource: Resource, lease: LeaseRef) -> Service | None:
    """Start the service that exposes ``resource`` for ``lease``.

    ``lease`` is a :class:`LeaseRef`. Never choose port numbers:
    ``host.serve_on_free_port(argv, ...)`` starts a program on a pre-bound socket;
    for one that only takes a number, ``host.free_port()``, ``host.processes.spawn(...)``
    and ``proc.wait_listening(...)``. Processes started that way are found again after a
    crash of the exporter. Return a :class:`Service` only once its endpoints accept
    connections; raise :class:`ServiceError` on failure (its message reaches the lease
    holder). ``None`` is a failure too ("returned None, not a Service").

    Starts and stops run in worker threads, several at once: a plugin that keeps state
    across resources guards it with a lock. One resource never has two at once: its next
    start waits until its last service is stopped.
    """


@hookspec(firstresult=True)
def devloop_operations(host: HostContext, resource: Resource) -> Sequence[OperationKind] | None:
    """Say which operations the plugin runs on ``resource``: a list of
    :class:`OperationKind` (``None``: none).

    Asked when the resource is reported; the coordinator lets a lease's holder (or an
    admin) start only these kinds on the device, and passes an operation to the plugin
    whose resource declared its kind. Read-only and cheap, like discovery.
    """


@hookspec(firstresult=True)
def devloop_operate(host: HostContext, resource: Resource, op: Operation) -> str | Mapping[str, Any] | None:
    """Run the operation ``op`` (an :class:`Operation`: ``kind``, ``args``, ``image``) on
    ``resource``, and return when it has ended.

    Return a short sentence of what was done, or a dict (JSON, bounded) of what it found,
    whose ``"message"``, if any, is that sentence; raise :class:`OperationError` with the
    reason. A failure counts as having changed the device unless the error says it did not
    (``OperationError(why, changed=False)``: it could not even open it): a *destructive*
    kind then leaves the device needing recovery. Check ``op.args`` yourself and refuse a
    bad one with ``changed=False``. Call ``op.progress(phase, done, total, unit)`` as the
    work goes on. What to touch (a block device, fastboot, a serial port) comes from the
    resource's config, never from the args.

    Runs in a thread of its own, beside the heartbeats; one exclusive operation a device at
    a time. It must end: a program it runs gets a timeout and, past it, its whole process
    group is killed (``host.run_to_end(argv, name=..., timeout=...)`` does both). If the
    exporter dies meanwhile, its next start reports the operation as interrupted.
    """


@hookspec(firstresult=True)
def devloop_power(host: HostContext, resource: Resource, action: str) -> PowerReading | None:
    """Switch the power of ``resource``'s device, or read it: the one hook of a power
    backend. ``resource`` is one of this plugin's of kind ``power`` (``POWER_KIND``);
    ``action`` is ``"on"``, ``"off"`` or ``"status"`` (a ``cycle`` is the exporter's: off,
    the off-time, on, watching the device's console meanwhile; docs/architecture.md, "Power").

    Return a :class:`PowerReading`: the state as the switch reads it back *after* the
    action (``None`` when it cannot be read: the exporter then trusts only the console,
    and a change nobody observed is reported ``unverified``), and a sentence of what was
    done. Raise :class:`OperationError` with a reason a person can act on ("no switchable
    hub at 1-1", "the BMC refused the password for admin"), ``changed=False`` when nothing
    was switched. What to switch and how (the backend, its address, a password *file*)
    comes from the resource's config, never from the request; a secret never appears in
    an argument list, a result or a message.

    Runs in the power operation's thread, one action at a time per device. It must end:
    a program gets a timeout (``host.run_to_end``), a request a socket timeout; past the
    resource config's ``timeout`` (seconds; 30 without one) the exporter fails the
    operation and leaves the call to run. A config model may give ``off_time`` (the
    cycle's default, seconds) and ``console_timeout`` (how long after on the console may
    stay silent); the exporter reads both from ``resource.config``. A reading whose
    ``console_follows`` is False (nothing runs whose console could print) ends an on at the
    switch: the exporter awaits no first byte.
    """


@hookspec(firstresult=True)
def devloop_thermal(host: HostContext, resource: Resource) -> Mapping[str, float] | None:
    """Read the temperatures of ``resource``'s device: a dict of zone name (``cpu``,
    ``battery``) -> degrees Celsius (a float), or ``None`` when the plugin has no thermal
    readings for it.

    A ``cooldown`` step between two leases (docs/architecture.md, "Steps between leases")
    waits until every zone of every resource of the device reads below its threshold,
    asking about once a second, each call within the exporter's hook deadline: a call that
    hangs is left to run and the reading counts as missing. Must be cheap, open no device
    node a service may hold, and spawn no process unless the plugin's own docstring says
    why it must (the adb plugin asks the phone through an adb server that serves that phone
    alone). Never report what another device's resources measure.
    """


@hookspec(firstresult=True)
def devloop_fingerprint(host: HostContext, resource: Resource) -> Mapping[str, str] | None:
    """Facts about ``resource``'s device that a reviewer needs to judge a number measured on
    it and that no command on the device tells (a board revision, a firmware version, how a
    board is cooled): a dict of key -> value, both strings, or ``None`` for none.

    Keys are lowercase words (``board.revision``: a letter first, then letters, digits, ``_``,
    ``.`` and ``-``, at most 64 characters), values at most 1000 characters; the exporter drops
    a key that is not such a word and cuts a value that is longer, and keeps the first 64 of
    a device's facts (its resources' together, in the order of its resources). They are
    reported with the device (``DeviceReport.facts``) and show in its fingerprint's ``extra``
    (``device-loop fingerprint``). Asked at each scan, within the hook deadline: read-only and
    cheap, like discovery (read the config, a file; spawn nothing, open no device node).
    """


@hookspec(firstresult=True)
def devloop_environment(host: HostContext, resource: Resource, service: Service | None) -> ContainerEnvironment | None:
    """What a container needs to use ``resource`` while it is leased: a
    :class:`ContainerEnvironment` of device nodes, mounts and environment variables, or
    ``None`` when a container cannot use it.

    ``service`` is what ``devloop_start`` returned for the lease (``None`` if the plugin
    serves none): its endpoints give the addresses a variable may carry. Built only from
    what the plugin discovered and started, never from anything a request carries: a
    device node's type, major and minor are read from the node itself (``device_node``),
    its mode is never world-writable, and paths are the resource's own. An answer that
    breaks the bounds of ``ContainerEnvironment`` (32 nodes, 32 mounts, 64 variables; 16 KiB
    as JSON) is refused whole and logged, as is one that raises or passes the hook deadline:
    the lease goes on without it. The exporter writes it as the lease's CDI spec
    (docs/architecture.md, "Containers and CDI"). Asked once the lease's service runs;
    opens no device node, spawns nothing.
    """


@hookspec(firstresult=True)
def devloop_metrics(host: HostContext) -> Mapping[str, float] | None:
    """What the plugin measures of itself on this host, for the lab's dashboards (a VM pool's
    size, the boots it made, how long a lease waited for one): a dict of name -> number, or
    ``None`` for none.

    The rule (tests/test_plugin_metrics.py): a name is ``[a-z][a-z0-9_]*``, at most 64
    characters; a plugin has at most 64 names; a value is a finite number (an ``int`` or a
    ``float``, not a ``bool``, NaN or infinity). A name or value that breaks it is dropped,
    and an answer of more than 64 names, or of something else than a dict, is dropped whole:
    never the report. What was dropped, and why, is logged and reported with the host
    (``device-loop hosts``). The coordinator shows each as the gauge
    ``device_loop_plugin_NAME{host="...", plugin="..."}`` on ``GET /metrics``, the host's
    latest answer while it is online. Asked once a scan (the heartbeat period), within the
    hook deadline: read what the plugin keeps; spawn nothing, open no device node.
    """


@hookspec(firstresult=True)
def devloop_steps(host: HostContext, resource: Resource | None) -> Sequence[StepKind] | None:
    """Say which steps between two leases the plugin runs on ``resource``: a list of
    :class:`StepKind` (``None``: none).

    An admin lists a device's steps in its config (``[[devices.steps]]``, ``step = NAME``);
    after every lease the exporter runs each, in order, as an operation: a plugin's step
    is handed to its ``devloop_operate`` with ``op.kind`` the step's name and ``op.args``
    the keys of the step's entry (those its ``settings`` declare) plus ``timeout_s``, and
    must end within that time (past it the step fails, and its thread is left to run). A
    step runs again from the first after an interrupted one, so it must be repeatable.

    Asked once at the exporter's start with ``resource=None`` (before ``devloop_startup``):
    every step the plugin may offer on any resource, so that a config naming another is
    refused; then per resource, each time it is reported: the steps it offers, which decides
    the resource a step runs on. Read-only and cheap, like discovery.
    """


@hookspec(firstresult=True)
def devloop_cleanup(host: HostContext, data: dict[str, Any]) -> None:
    """Undo what a service changed outside its processes, after its exporter died.

    A service of this plugin was running when the exporter was killed (kill -9, a crash):
    at the next start its processes are stopped as leftovers, and this hook gets the
    ``data`` its :class:`Service` carried (so keep there what undoing needs: the relay
    that was switched on). Called once per such service, after ``devloop_startup`` and
    before the first discovery. ``Service.data`` must be JSON to survive. The result is
    ignored; an error is logged.
    """


@hookspec(firstresult=True)
def devloop_stop(host: HostContext, service: Service) -> object:
    """Stop a service returned by ``devloop_start``.

    Return only when it is really gone: processes reaped, ports free. Return ``None``
    (or leave the hook out) to have the default stop ``service.processes`` after the
    plugin's own clean-up: the adb plugin forgets its phone and lets the default stop the
    server. Return anything else when the plugin stopped the processes itself.
    """
