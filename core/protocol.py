"""The exporter <-> coordinator protocol, written once: the coordinator validates what
exporters send with these models, exporters build their reports and read their desired
state with them, and the tests speak them too.

Unknown fields are refused (422): a report can not smuggle in a field the coordinator
owns (``mediated``, ``owner``, a lease binding). Every string, list and dict is bounded
(tests/test_hostile_exporters.py walks the models to hold them to it): an exporter's token
can be stolen, and what it reports is served to anyone who reads the board.
"""
from __future__ import annotations

import ipaddress
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from . import LEASE_PREFIX, NAME_PATTERN, container_env
from .usage import template_problem
from .vocabulary import AutoRecover, EndpointRole, Fidelity, HealthKind, HealthStatus, OperationState, Purpose

MAX_DEVICES_PER_REPORT = 1000
MAX_RESOURCES_PER_DEVICE = 32
MAX_SERVICES_PER_REPORT = 4 * MAX_DEVICES_PER_REPORT
MAX_ENDPOINTS_PER_SERVICE = 16
MAX_TAGS = 64
MAX_TAG_CHARS = 64
MAX_HOLDERS = 64  # processes reported holding one device's nodes
MAX_PLUGINS = 256
MAX_NAME_CHARS = 64
MAX_COMMAND_CHARS = 1000  # of a holder's command line
MAX_CGROUP_CHARS = 512  # of a holder's cgroup path
MAX_REASON_CHARS = 2000
MAX_OPERATION_KINDS = 16  # a resource serves
MAX_ARGS = 32             # of an operation
MAX_ARG_CHARS = 4096      # of one argument's text
MAX_RESULT_BYTES = 64 << 10  # an operation's result, as JSON (a boot log, say)
MAX_STEPS = 16            # a device runs between two leases
MAX_FACTS = 64            # a device's fingerprint fields from plugins (devloop_fingerprint); other bounded maps
MAX_DETAIL_CHARS = 200    # of an operation's progress in words ("cooling down: 51.2 °C, waiting for < 45 °C")
#: Who runs the steps that are not one plugin's (cooldown, command, settle): the exporter itself.
EXPORTER_STEPS = "exporter"
#: What an endpoint's host and an exporter's address may be: a DNS name, an IPv4 or an IPv6
#: address (no user, path or port: the coordinator builds URLs from it).
HOST_PATTERN = r"^(?:[A-Za-z0-9][A-Za-z0-9.-]{0,252}|[0-9A-Fa-f:.]{2,45})$"

Name = Annotated[str, StringConstraints(max_length=MAX_NAME_CHARS)]
Tag = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TAG_CHARS)]
Identifier = Annotated[str, StringConstraints(min_length=1, max_length=255)]
Reason = Annotated[str, StringConstraints(max_length=MAX_REASON_CHARS)]
Template = Annotated[str, StringConstraints(max_length=500)]
# params keys are template fields, env names are exported by `device-loop env` into a shell
ParamName = Annotated[str, StringConstraints(max_length=32, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")]
EnvName = Annotated[str, StringConstraints(max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
ParamValue = Annotated[str, StringConstraints(max_length=255)] | Annotated[int, Field(ge=-2**63, le=2**63 - 1)]
#: Operation kinds and phases (``capture-boot-log``, ``writing``): words a CLI and an agent type.
Word = Annotated[str, StringConstraints(min_length=1, max_length=32, pattern=r"^[a-z][a-z0-9-]{0,31}$")]
ArgName = Annotated[str, StringConstraints(min_length=1, max_length=32, pattern=r"^[a-z_][a-z0-9_]{0,31}$")]
ArgValue = (Annotated[str, StringConstraints(max_length=MAX_ARG_CHARS)] | bool
            | Annotated[int, Field(ge=-2**63, le=2**63 - 1)] | float | None)
FactKey = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_.-]{0,63}$")]
FactValue = Annotated[str, StringConstraints(max_length=1000)]
#: A plugin's metric (``devloop_metrics``), shown on /metrics as ``device_loop_plugin_NAME``.
MetricName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]{0,63}$")]
#: How many metrics one plugin reports of a host.
MAX_PLUGIN_METRICS = 64
Sha256 = Annotated[str, StringConstraints(min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$")]
# An operation's result: an object of scalars, lists of scalars, or objects of scalars (a boot
# log, a list of readings, a table of them), bounded here and in all (MAX_RESULT_BYTES)
ResultScalar = (Annotated[str, StringConstraints(max_length=MAX_RESULT_BYTES)] | bool
                | Annotated[int, Field(ge=-2**63, le=2**63 - 1)] | float | None)
ResultValue = (ResultScalar | Annotated[list[ResultScalar], Field(max_length=4096)]
               | Annotated[dict[ArgName, ResultScalar], Field(max_length=256)])
#: What an operation's caller passes it: a flat object of bounded scalars.
Args = Annotated[dict[ArgName, ArgValue], Field(max_length=MAX_ARGS)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


def check_host(host: str | None) -> str | None:
    """A validator for addresses (``HOST_PATTERN``): one with a colon is an IPv6 address."""
    if host is not None and ":" in host:
        ipaddress.IPv6Address(host)  # its ValueError says what is wrong
    return host


def check_device_name(name: str) -> str:
    """A validator for device names: ``lease-`` is the prefix of lease ids."""
    if name.startswith(LEASE_PREFIX):
        raise ValueError(f"device names must not start with {LEASE_PREFIX!r} (that prefix names leases)")
    return name


class EndpointReport(Strict):
    """Where a client connects; ``kind`` is the resource kind (``uart``, ``adb``...), ``role``
    what a client does with it (``EndpointRole``; a plugin of a new kind may name its own)."""
    kind: str = Field(min_length=1, max_length=32)
    role: Word | None = Field(default=None, description=f"what it is for: {', '.join(EndpointRole)} or a plugin's own")
    host: str = Field(min_length=1, max_length=255, pattern=HOST_PATTERN)
    port: int = Field(ge=1, le=65535)
    url: str | None = Field(default=None, max_length=2048)
    protocol: str | None = Field(default=None, max_length=32)
    params: dict[ParamName, ParamValue] | None = Field(default=None, max_length=16)
    command: Template | None = Field(default=None, description="how to use it: a template (core/usage.py)")
    env: dict[EnvName, Template] | None = Field(default=None, max_length=16,
                                                description="exports that point tools at it")

    _host_is_an_address = field_validator("host")(check_host)

    @model_validator(mode="after")
    def _templates_name_only_fields(self) -> "EndpointReport":
        params = (self.params or {}).keys()
        for where, template in [("command", self.command), *((f"env {k}", v) for k, v in (self.env or {}).items())]:
            problem = template_problem(template, params) if template is not None else None
            if problem:
                raise ValueError(f"{where}: {problem}")
        return self


class OperationKindReport(Strict):
    """An operation a resource's plugin runs on it (``devloop_operations``)."""
    kind: Word
    description: str = Field(default="", max_length=500)
    args: dict[ArgName, Annotated[str, StringConstraints(max_length=200)]] = Field(
        default_factory=dict, max_length=MAX_ARGS, description="each argument it takes, with what it means")
    exclusive: bool = Field(default=True, description="needs the device alone: one such operation a device at a time")
    destructive: bool = Field(default=False, description="a failure once it began leaves the device needing recovery")


class ResourceReport(Strict):
    kind: str = Field(min_length=1, max_length=32)
    plugin: str = Field(min_length=1, max_length=64)
    identifier: str = Field(min_length=1, max_length=255)
    health: HealthStatus = HealthStatus.OK
    reason: str = Field(default="", max_length=1000)
    health_kind: HealthKind = Field(default=HealthKind.TRANSIENT,
                                    description="a fault's kind: transient (re-probed) or permanent (a person clears "
                                                "it)")
    service: bool = Field(default=True, description="a lease gets a service of it (a flash target: no, it is "
                                                    "written only through operations)")
    operations: list[OperationKindReport] = Field(default_factory=list, max_length=MAX_OPERATION_KINDS)


class Holder(Strict):
    """A process holding a device node that did not hold it when the lease began."""
    pid: int = Field(ge=0, le=2**31)
    command: str = Field(max_length=MAX_COMMAND_CHARS)
    cgroup: str = Field(default="", max_length=MAX_CGROUP_CHARS,
                        description="the cgroup it runs in (/proc/PID/cgroup): a container's names its container")


class StepReport(Strict):
    """A step the exporter runs on a device between two leases (docs/architecture.md,
    "Steps between leases"), as its config lists them, in order. The coordinator queues
    each as an operation whose kind is the step's name, of purpose step, with ``step = INDEX``
    (its place in this list; ``DesiredOperation``); what the step does (a threshold, a command) stays in the
    exporter's config, never in the request."""
    step: Word = Field(description="cooldown, reboot, reflash, command, or a plugin's own step")
    plugin: Name = Field(description=f"who runs it: {EXPORTER_STEPS!r} (cooldown, command), else the plugin whose "
                                     "resource offers it (reflash: the flash target's)")
    identifier: Identifier = Field(description="the resource it runs on")
    timeout_s: float = Field(gt=0, le=7 * 86400, description="past it the step fails and the device is faulty")
    settle: bool = Field(default=False, description="run by settle inside a lease too (the cooldown steps)")


class Quarantine(Strict):
    """A device whose transient faults keep coming back (docs/architecture.md, "Health that
    heals"): faulty, probed again at growing intervals, re-admitted after ``needed`` good
    probes in a row. Each probe changes it (``probes``), so each is a line of its ring log."""
    failures: int = Field(ge=1, le=10_000, description="how often its health turned failed within window_s")
    window_s: float = Field(gt=0, le=7 * 86400)
    probe_s: float = Field(gt=0, le=7 * 86400, description="the time to its next probe")
    probes: int = Field(default=0, ge=0, le=2**31, description="probes so far")
    good: int = Field(default=0, ge=0, le=10_000, description="good probes in a row")
    needed: int = Field(ge=1, le=10_000, description="good probes in a row that re-admit it")
    reason: Reason = Field(default="", description="why its last check failed")


class DeviceReport(Strict):
    name: str = Field(max_length=64, pattern=NAME_PATTERN)
    device_class: str = Field(alias="class", min_length=1, max_length=64)
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)
    resources: list[ResourceReport] = Field(min_length=1, max_length=MAX_RESOURCES_PER_DEVICE)
    busy_by: list[Holder] = Field(default_factory=list, max_length=MAX_HOLDERS)
    steps: list[StepReport] = Field(default_factory=list, max_length=MAX_STEPS,
                                    description="what runs between two leases, in order")
    facts: dict[FactKey, FactValue] = Field(default_factory=dict, max_length=MAX_FACTS,
                                            description="what plugins add to the device's fingerprint "
                                                        "(devloop_fingerprint): board revision, firmware")
    auto_recover: AutoRecover | None = Field(
        default=None, description="power-cycle it once when its health turns failed while nobody holds it")
    fidelity: Fidelity = Field(default=Fidelity.HARDWARE,
                               description="what it is: a board, a simulation, a virtual machine or an emulator "
                                           "(what its resources' plugins say)")
    quarantine: Quarantine | None = Field(default=None, description="its quarantine (its first resource in one)")

    @field_validator("name")
    @classmethod
    def _not_a_lease_id(cls, name: str) -> str:
        return check_device_name(name)


#: A path a container environment names (core/container_env.py holds plugins to the same).
ContainerPath = Annotated[str, StringConstraints(min_length=1, max_length=container_env.MAX_PATH,
                                                 pattern=r"^/[^\x00]*$")]
ContainerEnvName = Annotated[str, StringConstraints(max_length=64, pattern=f"^{container_env.ENV_NAME_PATTERN}$")]
MAX_ENVIRONMENT_BYTES = 16 << 10  # a resource's whole environment, as JSON


class DeviceNodeReport(Strict):
    """A device node a container gets (``core.container_env.DeviceNode``)."""
    path: ContainerPath
    host_path: ContainerPath
    node_type: Literal["c", "b"]  # (named so: "type" is a key of the schemas tests walk)
    major: int = Field(ge=0, le=2**32 - 1)
    minor: int = Field(ge=0, le=2**32 - 1)
    file_mode: int = Field(ge=0, le=0o7777)
    permissions: str = Field(min_length=1, max_length=3, pattern=f"^{container_env.CGROUP_ACCESS_PATTERN}$")

    @field_validator("file_mode")
    @classmethod
    def _not_world_writable(cls, mode: int) -> int:
        if mode & 0o002:
            raise ValueError(f"a device node's mode is never world-writable: {oct(mode)}")
        return mode


class MountReport(Strict):
    """A bind mount a container gets (``core.container_env.Mount``)."""
    host_path: ContainerPath
    container_path: ContainerPath
    options: list[Annotated[str, StringConstraints(max_length=32, pattern=f"^{container_env.MOUNT_OPTION_PATTERN}$")]] \
        = Field(default_factory=list, max_length=container_env.MAX_OPTIONS)


class EnvironmentReport(Strict):
    """What a container needs of a leased resource (its plugin's ``devloop_environment``),
    bounded as ``ContainerEnvironment`` is, and in all (``MAX_ENVIRONMENT_BYTES``)."""
    nodes: list[DeviceNodeReport] = Field(default_factory=list, max_length=container_env.MAX_NODES)
    mounts: list[MountReport] = Field(default_factory=list, max_length=container_env.MAX_MOUNTS)
    env: dict[ContainerEnvName, Annotated[str, StringConstraints(max_length=container_env.MAX_VALUE,
                                                                 pattern=r"^[^\x00]*$")]] = Field(
        default_factory=dict, max_length=container_env.MAX_ENV)

    @model_validator(mode="after")
    def _bounded(self) -> "EnvironmentReport":
        paths = [p for n in self.nodes for p in (n.path, n.host_path)]
        paths += [p for m in self.mounts for p in (m.host_path, m.container_path)]
        if any(".." in p.split("/") for p in paths):
            raise ValueError("a container environment's paths have no '..'")
        if len(self.model_dump_json()) > MAX_ENVIRONMENT_BYTES:
            raise ValueError(f"a container environment takes at most {MAX_ENVIRONMENT_BYTES} bytes as JSON")
        return self


class ServiceReport(Strict):
    """A service the exporter runs for a lease (or failed to start: ``error``), with what a
    container needs of its resource (``environment``: docs/architecture.md, "Containers and CDI")."""
    lease: str = Field(min_length=1, max_length=64)
    device: str = Field(min_length=1, max_length=64)
    identifier: str = Field(min_length=1, max_length=255)
    kind: str = Field(min_length=1, max_length=32)
    endpoints: list[EndpointReport] = Field(default_factory=list, max_length=MAX_ENDPOINTS_PER_SERVICE)
    error: str | None = Field(default=None, max_length=2000)
    environment: EnvironmentReport | None = None


class Progress(Strict):
    done: int = Field(default=0, ge=0, le=2**63 - 1)
    total: int | None = Field(default=None, ge=0, le=2**63 - 1)
    unit: str = Field(default="", max_length=16, description="bytes, lines, steps...")
    detail: str = Field(default="", max_length=MAX_DETAIL_CHARS,
                        description="where it stands, in words: cooling down: 51.2 °C, waiting for < 45 °C")


#: What an exporter reports of an operation: it has begun, so it runs or has ended.
ReportedState = Literal[OperationState.RUNNING, OperationState.DONE, OperationState.FAILED]


class OperationReport(Strict):
    """An operation the exporter runs, or finished and has not had acknowledged yet (a
    heartbeat that carried its result was answered)."""
    op: Name
    device: Name
    kind: Word
    state: ReportedState
    phase: Word
    progress: Progress = Field(default_factory=Progress)
    message: Reason = ""
    seconds: dict[Word, float] = Field(default_factory=dict, max_length=16,
                                       description="how long each phase took so far")
    result: dict[ArgName, ResultValue] | None = Field(default=None, max_length=MAX_ARGS,
                                                    description=f"what it found, as JSON ({MAX_RESULT_BYTES} bytes "
                                                                "at most)")
    changed: bool = Field(default=False, description="the device may have been changed (its plugin began)")
    interrupted: bool = Field(default=False, description="the exporter's stop or restart cut it short, not a failure "
                                                         "of its own (docs/architecture.md, \"Operations\")")

    @field_validator("result")
    @classmethod
    def _small(cls, result: dict[str, Any] | None) -> dict[str, Any] | None:
        if result is not None and len(json.dumps(result)) > MAX_RESULT_BYTES:
            raise ValueError(f"a result may take {MAX_RESULT_BYTES} bytes of JSON at most")
        return result


class CandidateReport(Strict):
    """Something found on the network: an admin adopts it before anyone can book it."""
    identifier: str = Field(min_length=1, max_length=255)
    kind: str = Field(min_length=1, max_length=32)
    plugin: str = Field(min_length=1, max_length=64)
    label: str = Field(default="", max_length=200)


class SkippedPlugin(Strict):
    name: Name
    reason: Reason


class UnservedDevice(Strict):
    device: Name
    plugin: Name
    reason: Reason


class PluginStep(Strict):
    """A step a plugin offers (``devloop_steps``), or one of the exporter's own."""
    plugin: Name
    step: Word
    description: str = Field(default="", max_length=500)


class PluginMetrics(Strict):
    """What a plugin measures of itself on this host (``devloop_metrics``: a VM pool's size,
    its boots): name -> a finite number, and why what it answered besides was left out."""
    plugin: Name
    values: dict[MetricName, float] = Field(default_factory=dict, max_length=MAX_PLUGIN_METRICS)
    dropped: Reason = Field(default="", description="what of its answer was left out, and why")


class PluginsReport(Strict):
    loaded: list[Name] = Field(default_factory=list, max_length=MAX_PLUGINS)
    skipped: list[SkippedPlugin] = Field(default_factory=list, max_length=MAX_PLUGINS)
    failing: list[SkippedPlugin] = Field(default_factory=list, max_length=MAX_PLUGINS,
                                         description="loaded, but its last discovery raised")
    unserved: list[UnservedDevice] = Field(default_factory=list, max_length=MAX_DEVICES_PER_REPORT,
                                           description="configured, but no plugin serves it")
    steps: list[PluginStep] = Field(default_factory=list, max_length=MAX_PLUGINS,
                                    description="the steps between leases this exporter can run")
    metrics: list[PluginMetrics] = Field(default_factory=list, max_length=MAX_PLUGINS,
                                         description="what each plugin measures of itself here (devloop_metrics)")


class Heartbeat(Strict):
    """A full snapshot of one exporter's host (docs/architecture.md, "Reconcile, not push"):
    the coordinator replaces what it held for the host with it."""
    protocol: int
    version: str = Field(max_length=64)
    boot_id: str = Field(min_length=1, max_length=64)
    generation: int = Field(ge=0, le=2**63 - 1)
    heartbeat_s: float = Field(gt=0, le=3600)
    plugins: PluginsReport = Field(default_factory=PluginsReport)
    devices: list[DeviceReport] = Field(default_factory=list, max_length=MAX_DEVICES_PER_REPORT)
    services: list[ServiceReport] = Field(default_factory=list, max_length=MAX_SERVICES_PER_REPORT)
    applied: list[Name] = Field(default_factory=list, max_length=MAX_SERVICES_PER_REPORT,
                                description="lease ids of the desired state last converged to")
    stopping: bool = Field(default=False, description="the exporter's last report: it is going away")
    candidates: list[CandidateReport] = Field(default_factory=list, max_length=MAX_DEVICES_PER_REPORT)
    operations: list[OperationReport] = Field(default_factory=list, max_length=MAX_DEVICES_PER_REPORT)
    address: str | None = Field(default=None, max_length=255, pattern=HOST_PATTERN,
                                description="the host's own address (its advertise_address): every endpoint "
                                            "is there, and the coordinator fetches a camera's snapshot only there")

    _address_is_an_address = field_validator("address")(check_host)

    @model_validator(mode="after")
    def _endpoints_at_the_host_s_address(self) -> "Heartbeat":
        if self.address is not None:
            elsewhere = sorted({e.host for s in self.services for e in s.endpoints} - {self.address})
            if elsewhere:
                raise ValueError(f"every endpoint must be at this host's own address {self.address} (the exporter's "
                                 f"advertise_address), not at {', '.join(elsewhere)}")
        return self

    @model_validator(mode="after")
    def _each_thing_once(self) -> "Heartbeat":
        for what, values in (("device name", [d.name for d in self.devices]),
                             ("resource identifier", [r.identifier for d in self.devices for r in d.resources])):
            seen: set[str] = set()
            repeated: set[str] = set()
            for value in values:
                (repeated if value in seen else seen).add(value)
            if repeated:
                raise ValueError(f"each {what} may appear once in a report: {', '.join(sorted(repeated))}")
        return self


class DesiredService(Strict):
    """One service the exporter should run: a resource of a leased device."""
    lease: Name
    holder: Identifier
    device: Name
    identifier: Identifier
    kind: Name
    plugin: Name
    secret: Identifier | None = None


class Adoption(Strict):
    """A network candidate an admin adopted: the device it now is."""
    identifier: Identifier
    name: Name
    device_class: Name = Field(alias="class")
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)


class ImageRef(Strict):
    """An image of the registry an operation writes: the exporter fetches it (sha256-checked)."""
    sha256: Sha256
    size: int = Field(ge=0, le=2**63 - 1)
    name: Name


class DesiredOperation(Strict):
    """An operation the exporter should begin on a resource of one of its devices, and why
    (``purpose``, docs/architecture.md "Operations"): the executor hands it to the handler of
    its purpose and kind, never guessing from its arguments."""
    op: Name
    kind: Word
    device: Name
    identifier: Identifier
    plugin: Name
    requester: Identifier = Field(description="who asked for it (person, agent or admin)")
    args: Args = Field(default_factory=dict)
    image: ImageRef | None = None
    purpose: Purpose = Purpose.LEASE
    step: int | None = Field(default=None, ge=0, lt=MAX_STEPS,
                             description="a step's place in the device's steps (purpose step only)")

    @model_validator(mode="after")
    def _a_step_has_its_place(self) -> "DesiredOperation":
        if (self.purpose == Purpose.STEP) != (self.step is not None):
            raise ValueError("an operation has a step (its place in the device's steps) exactly when its purpose is "
                             "step")
        return self


class DesiredState(Strict):
    """The heartbeat's answer (and the long-poll's): what this host should run."""
    services: list[DesiredService] = Field(default_factory=list,
                                           max_length=MAX_DEVICES_PER_REPORT * MAX_RESOURCES_PER_DEVICE)
    operations: list[DesiredOperation] = Field(default_factory=list, max_length=MAX_DEVICES_PER_REPORT)
    adopted: list[Adoption] = Field(default_factory=list, max_length=MAX_DEVICES_PER_REPORT)
    etag: Name | None = None
    as_of: float = Field(default=0.0, description="coordinator time of the read: of two answers, the later wins")
