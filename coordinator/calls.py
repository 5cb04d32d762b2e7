"""Everything a client can ask the coordinator, declared once (``CALLS``): each call's name,
who may make it, what it takes (a model of ``schemas.py``) and what it answers (a type of
``core/answers.py``). The REST routes (``api.py``), the MCP tools (``mcp_tools.py``) and the
OpenAPI document (``openapi.py``) are all made from this table, and the access guard test
(tests/test_access.py) holds it to who may call what. A route's path is written here under
the one prefix every route has (``API_PREFIX``; ``Call.route`` is the path served).

A call's ``run(ctx, args)`` asks the services (``rules.py``) and returns the answer; what only
one side has (an upload's streamed body, ``ctx.stream``; an image's file; a JPEG for an agent)
that side provides.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

from pydantic import BaseModel, ValidationError

from device_loop.core import API_PREFIX, FLASH_KIND, POWER_KIND, PROTOCOL_VERSION, SETTLE_KIND, __version__
from device_loop.core.ab.jobs import CellReport, JobSummary, RunRecord
from device_loop.core.protocol import DesiredState, Heartbeat
from device_loop.core.scopes import POWER_OPERATION
from device_loop.core.vocabulary import LIVE_OP_STATES, JobState, PowerAction, TicketKind

from . import device_commands, relays
from device_loop.core.answers import (AuditEntry, CandidateAnswer, CdiAnswer, ClaimAnswer, DeviceAnswer, ExecAnswer,
                                      HealthAnswer, HostAnswer, ImageAnswer, JobAnswer, JobRunsAnswer, LeaseAnswer,
                                      LogEntry, OperationAnswer, QueueEntry, TicketAnswer, TokenAnswer, WhoamiAnswer)
from device_loop.core.errors import ErrorCode
from .errors import APIError
from .evidence import evidence_markdown
from .identity import ADMIN, ANYONE, EXPORTER, USER, issue_token, token_view
from .job_schemas import (ClaimJobIn, ExecIn, FinishJobIn, JobFilter, JobId, JobReserveIn, JobRunsPage, JobWait,
                          SubmitJobIn)
from .power import power_args
from .rules import Rules
from .schemas import (AdminDevice, AdminPowerIn, AdoptIn, ClaimTicketIn, CollectIn, DesiredWait, DeviceFilter,
                      DeviceName, DeviceOperations, DrainIn, FlashIn, ForgetIn, HostName, ImageFilter, ImageOfHost,
                      ImageRefIn, KnownGoodIn, LeaseId, LeaseWait, MarkFaultyIn, MyLeases, NoArgs, OperationIn, OpWait,
                      PowerIn, PowerSwitch, RenewIn, ReserveIn, RetireIn, TicketFilter, TicketId, TicketWait, TokenId,
                      TokenIn, TokenSetIn, UartExchangeIn, UploadQuery, split_tags)
from .who import Who


@dataclass
class Ctx:
    """One call as its ``run`` sees it."""
    rules: Rules
    caller: Who                          # who calls (docs/architecture.md, "Who may act on what")
    gone: Callable[[], Awaitable[None]]  # returns once the caller hung up (a tool's caller: never)
    max_wait_s: float                    # the longest a long-poll may wait here
    body: Any = None                     # a call that takes a model of its own as its body: that
    via_tool: bool = False               # an MCP tool call: its queue tickets are batch
    stream: AsyncIterator[bytes] | None = None  # a streamed call's body, as the REST side reads it
    status: int | None = None            # what REST answers, where the run decides (an upload it had: 200)


@dataclass(frozen=True)
class Call:
    name: str                                      # the OpenAPI operationId, and the MCP tool's name
    access: str                                    # identity.ANYONE, USER, EXPORTER or ADMIN
    run: Callable[[Ctx, Any], Awaitable[Any]]
    args: type[BaseModel] = NoArgs                 # what the caller passes
    answer: Any = dict                             # the answer's type
    method: str | None = None                      # its REST route's method ...
    path: str | None = None                        # ... and path, under API_PREFIX; None: a tool only
    tool: bool = False                             # an MCP tool too
    tool_key: str | None = None                    # a list answer, as a tool's: under this key
    status: int = 200                              # what REST answers when it is done (201: made)
    idempotent: bool = False                       # takes an Idempotency-Key (a call that changes something)
    body: type[BaseModel] | None = None            # a body that is a model of its own (the heartbeat)
    max_body: int | None = None                    # its body's limit, where not the default (limits.py)
    streamed: bool = False                         # its body is bytes, streamed (ctx.stream); what it takes: the query
    refusals: frozenset[int] = frozenset()         # what it refuses besides what its shape tells (openapi.py)
    database: bool = True                          # it reads or writes the lab's database (out of reach: 503)
    aliases: tuple[str, ...] = ()                  # other names of its tool
    media_type: str | None = None                  # an answer that is text of this type, not JSON
    description: str = field(default="")
    # what the call waits for before it acts, awaited first and holding nothing: an
    # idempotent call's transaction begins after it (docs/architecture.md, "Nothing that waits
    # holds the lab")
    ready: Callable[[Ctx, Any], Awaitable[None]] | None = None
    # the scope operation it needs (docs/architecture.md, "Shares of one lab"): a name, or
    # what its arguments name (a power action, an operation's kind); None: a reading call,
    # or one only admins and exporters make (their tokens have no scope)
    needs: str | Callable[[Any], str] | None = None

    def operation(self, args: Any) -> str | None:
        """The scope operation this call with ``args`` needs, or None if it needs none."""
        return self.needs(args) if callable(self.needs) else self.needs

    async def carry_out(self, ctx: Ctx, args: Any) -> Any:
        """Wait for what the call waits for (``ready``), then run it."""
        if self.ready is not None:
            await self.ready(ctx, args)
        return await self.run(ctx, args)

    @property
    def route(self) -> str:
        """Its REST route's path as served: the table's, under the API's one prefix."""
        assert self.path is not None, f"{self.name} is a tool only"
        return API_PREFIX + self.path

    @property
    def doc(self) -> str:
        return " ".join((self.description or self.run.__doc__ or "").split())


async def _until(ctx: Ctx, wait_s: float) -> float:
    return min(wait_s, ctx.max_wait_s)


# ---- the board -------------------------------------------------------------------------------

async def health(ctx: Ctx, args: NoArgs) -> HealthAnswer:
    """That the coordinator answers: its version and the exporter protocol it speaks."""
    return {"ok": True, "version": __version__, "protocol": PROTOCOL_VERSION}


async def list_devices(ctx: Ctx, args: DeviceFilter) -> list[DeviceAnswer]:
    """Devices of the lab with state, host, holder and time left; filter by state (idle,
    in_use, ...) and by tags (all must match)."""
    wanted = set(split_tags(args.tags))
    return [d for d in await ctx.rules.devices.list_devices()
            if (args.state is None or d["state"] == args.state) and wanted <= set(d["tags"])
            and args.device_class in (None, d["class"])]


async def device_info(ctx: Ctx, args: DeviceName) -> DeviceAnswer:
    """One device: class, tags, state, host, holder, its resources with their health and the
    operations they run; admins also see the id of its live lease."""
    return await ctx.rules.devices.device_info(args.device, ctx.caller)


async def device_log(ctx: Ctx, args: DeviceName) -> list[LogEntry]:
    """The device's last 20 state changes: time, from, to, cause, actor."""
    return await ctx.rules.devices.device_log(args.device, ctx.caller)


async def _operations_of(ctx: Ctx, device: str, kind: str | None) -> list[OperationAnswer]:
    return await ctx.rules.operations.of_device(device, kind=kind, who=ctx.caller)


async def device_operations(ctx: Ctx, args: DeviceOperations) -> list[OperationAnswer]:
    """A device's last 20 operations (of a kind), newest first: kind, state, phase, progress,
    result."""
    return await _operations_of(ctx, args.device, args.kind)


async def device_flashes(ctx: Ctx, args: DeviceName) -> list[OperationAnswer]:
    """A device's last 20 flashes (its operations of kind flash)."""
    return await _operations_of(ctx, args.device, FLASH_KIND)


async def list_hosts(ctx: Ctx, args: NoArgs) -> list[HostAnswer]:
    """The exporters: online, versions, plugins, heartbeat age, devices."""
    return await ctx.rules.devices.hosts()


# ---- the exporter protocol ---------------------------------------------------------------------

async def heartbeat(ctx: Ctx, args: HostName) -> dict:
    """A full snapshot of the host (its exporter's); the answer is what it should run."""
    return await ctx.rules.hosts.heartbeat(args.host, ctx.body, f"exporter:{args.host}")


async def desired(ctx: Ctx, args: DesiredWait) -> dict:
    """What the host should run; long-polls until its etag differs from ``etag``."""
    return await ctx.rules.hosts.wait_desired(args.host, args.etag, await _until(ctx, args.wait_s), ctx.gone,
                                              args.boot)


# ---- leases ----------------------------------------------------------------------------------------

def ticket_kind(ctx: Ctx) -> TicketKind:
    """Who a caller's tickets are served as, from who is calling, never from the request: an
    MCP tool's caller or an agent's token is batch, a person through REST interactive."""
    return TicketKind.BATCH if ctx.via_tool or ctx.caller.agent else TicketKind.INTERACTIVE


async def reserve(ctx: Ctx, args: ReserveIn) -> LeaseAnswer | TicketAnswer:
    """Reserve a device by name, or any free device of a class and/or with tags (the one idle
    the longest), of what needs takes ('any': a virtual machine or an emulator; 'real-hw': a
    board or a simulated one). Answers at once with a lease (state 'pending' until its
    endpoints are up: follow it with lease_status), or, with queue, a ticket when nothing that
    matches is free (follow it with claim_ticket until it holds a lease; with needs 'any' and
    fallback 'real-hw' it takes a board too after fallback_after_s), or says why not and what
    is free. With keepalive_s the lease lives only while renewed (renew without ttl_s every
    third of it) and a queued ticket while read; with image, a device already running that
    image is preferred."""
    return await ctx.rules.scheduler.reserve(args.device, args.device_class, args.tags, args.ttl_s, args.queue,
                                             ctx.caller, ticket_kind(ctx), args.need, args.keepalive_s, args.image)


async def ticket_status(ctx: Ctx, args: TicketWait) -> TicketAnswer:
    """A queue ticket: state (waiting, granted, claimed, cancelled, expired), position and an
    estimate of when it is granted (likely_at, earliest_at to latest_at) while waiting, and once
    granted its lease. Reading it changes nothing: a grant is claimed with claim_ticket. With
    wait_s, answers at its first change."""
    return await ctx.rules.scheduler.wait(args.ticket_id, ctx.caller, await _until(ctx, args.wait_s), ctx.gone)


async def claim_ticket(ctx: Ctx, args: ClaimTicketIn) -> TicketAnswer:
    """Follow your queue ticket: once granted, claim it (its lease is yours; a grant not
    claimed within the claim window passes to the next ticket); a waiting keepalive ticket is
    kept meanwhile. With wait_s, answers at its first change, claimed if granted."""
    return await ctx.rules.scheduler.wait(args.ticket_id, ctx.caller, await _until(ctx, args.wait_s), ctx.gone,
                                          claim=True)


async def cancel_ticket(ctx: Ctx, args: TicketId) -> TicketAnswer:
    """Cancel a queue ticket (a granted one not yet claimed gives its lease back)."""
    return await ctx.rules.scheduler.cancel(args.ticket_id, ctx.caller)


async def my_tickets(ctx: Ctx, args: TicketFilter) -> list[TicketAnswer]:
    """The caller's queue tickets, open ones first (an admin's all=true: everyone's)."""
    return await ctx.rules.scheduler.tickets(ctx.caller, args.everyone and ctx.caller.may_see_all)


async def queue_board(ctx: Ctx, args: NoArgs) -> list[QueueEntry]:
    """The waiting tickets, in the order they are served: who, for what, how long,
    interactive or batch (ids only to their requesters and admins)."""
    return await ctx.rules.scheduler.queue(ctx.caller)


async def settle(ctx: Ctx, args: LeaseId) -> OperationAnswer:
    """Run the leased device's cool-down steps now (between two benchmark runs, say): answers
    at once with the operation (follow it with operation_status, wait_s, until it is 'done':
    the device is cool); 'done' at once for a device that has no cool-down step."""
    return await ctx.rules.steps.settle(args.lease_id, ctx.caller)


async def whoami(ctx: Ctx, args: NoArgs) -> WhoamiAnswer:
    """Who the lab takes you for: your name, kind, priority band and scope, and (a token with a
    budget) the device-minutes left this period and when they renew. Reserve within it: a lease
    longer than what is left is granted only to the budget's end."""
    return await ctx.rules.budgets.whoami(ctx.caller)


async def my_leases(ctx: Ctx, args: MyLeases) -> list[LeaseAnswer]:
    """The caller's live leases (on one device: their lease there, live or the last that ended)."""
    return await ctx.rules.leases.mine(ctx.caller, args.device)


async def lease_status(ctx: Ctx, args: LeaseWait) -> LeaseAnswer:
    """A lease: state, endpoints, expires_at, a plain reason while it is not ready, and
    commands to run against its endpoints. With wait_s, answers once its state changes."""
    leases, caller = ctx.rules.leases, ctx.caller
    wait = await _until(ctx, args.wait_s)
    unless = args.unless
    if wait and unless is None:
        unless = (await leases.status(args.lease_id, caller))["state"]
    return await leases.wait(args.lease_id, caller, unless, wait, ctx.gone)


async def lease_cdi(ctx: Ctx, args: LeaseId) -> CdiAnswer:
    """The lease's CDI spec, as its exporter wrote it into its CDI folder (/var/run/cdi unless
    configured), and device_name, what `podman run --device` takes on the exporter's host
    (device-loop.dev/<class>=<device>): the container gets the leased device's nodes, mounts
    and variables. Refused (409) while no service runs, or when nothing of it is for a container."""
    return await ctx.rules.leases.cdi(args.lease_id, ctx.caller)


async def renew(ctx: Ctx, args: RenewIn) -> LeaseAnswer:
    """Extend a lease: it then ends ttl_s seconds from now; without ttl_s, keep a keepalive
    lease alive (it expires keepalive_s from now, never past its end)."""
    return await ctx.rules.leases.renew(args.lease_id, args.ttl_s, ctx.caller)


async def release(ctx: Ctx, args: LeaseId) -> LeaseAnswer:
    """Give a device back: its lease ends and the device is reclaimed."""
    return await ctx.rules.leases.release(args.lease_id, ctx.caller)


# ---- operations on devices ------------------------------------------------------------------------

async def start_operation(ctx: Ctx, args: OperationIn) -> OperationAnswer:
    """Start an operation on the device of your lease: a kind its resources run (device_info
    lists them with their arguments), e.g. flash with args {"image": REF}. Answers at once
    with the operation (state 'queued'): follow it with operation_status."""
    given = args.args
    if args.kind == POWER_KIND and set(given) <= set(PowerSwitch.model_fields):  # (others: named below as unknown)
        try:
            switch = PowerSwitch.model_validate(given)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"])) or "args"
            field = PowerSwitch.model_fields.get(str(first["loc"][0])) if first["loc"] else None
            said = (f"missing: {field.description}" if first["type"] == "missing" and field is not None
                    else first["msg"].removeprefix("Value error, "))
            raise APIError(422, ErrorCode.INVALID, f"args.{where}: {said}") from None
        given = power_args(switch.action, switch.off_time_s)
    return await ctx.rules.operations.start(args.lease_id, args.kind, given, ctx.caller)


async def flash(ctx: Ctx, args: FlashIn) -> OperationAnswer:
    """Flash an image (its ref, sha256:..., or its name, from list_images) onto the device of
    your lease. Answers at once with the operation (state 'queued'): follow it with
    operation_status until its state is 'done' or 'failed'. A failure part-way leaves the
    device needing recovery: then call recover."""
    return await ctx.rules.operations.flash(args.lease_id, args.image, ctx.caller)


async def recover(ctx: Ctx, args: LeaseId) -> OperationAnswer:
    """Flash the latest known-good image of your leased device (else of its class) back onto
    it; its success clears the device's needs_recovery. Follow it with operation_status."""
    return await ctx.rules.operations.recover(args.lease_id, ctx.caller)


async def operation_status(ctx: Ctx, args: OpWait) -> OperationAnswer:
    """An operation: kind, state (queued, running, done, failed), phase, progress, result and
    message. With wait_s, answers as soon as its state changes, or after wait_s."""
    operations, caller = ctx.rules.operations, ctx.caller
    wait = await _until(ctx, args.wait_s)
    unless = args.unless
    if wait and unless is None:
        unless = (await operations.op(args.op_id, caller))["state"]
        if unless not in LIVE_OP_STATES:
            wait = 0  # it has ended: no change is coming
    return await operations.wait(args.op_id, unless, wait, ctx.gone, who=caller)


async def power(ctx: Ctx, args: PowerIn) -> OperationAnswer:
    """Switch the power of your leased device: on, off, cycle (off for off_time_s, then on) or
    status. Answers at once with the operation (state 'queued'): follow it with
    operation_status until 'done' or 'failed'. Its result says what was observed: verdict
    'verified' (the switch read back the change, or the console went silent while off and
    printed again after on; first_byte_s is the time to its first byte) or 'unverified' (nothing
    showed it: then do not count on it having happened)."""
    return await ctx.rules.operations.start(args.lease_id, POWER_KIND, power_args(args.action, args.off_time_s),
                                            ctx.caller)


async def power_unleased(ctx: Ctx, args: AdminPowerIn) -> OperationAnswer:
    """Switch the power of a device nobody holds (a hung board): on, off, cycle or status."""
    return await ctx.rules.operations.start_unleased(args.device, POWER_KIND,
                                                     power_args(args.action, args.off_time_s), ctx.caller.name)


async def recover_unleased(ctx: Ctx, args: AdminDevice) -> OperationAnswer:
    """Recover a device nobody holds (its holder gave it back broken)."""
    return await ctx.rules.operations.recover_unleased(args.device, ctx.caller.name)



async def kill_orphans(ctx: Ctx, args: AdminDevice) -> OperationAnswer:
    """Have a device's exporter kill (SIGKILL) the processes that still hold its node after its
    lease ended (its orphans: a container's too), as that exporter sees them when it acts.
    Answers at once with the operation: its result names each process killed."""
    return await ctx.rules.operations.kill_orphans(args.device, ctx.caller.name)

# ---- what agents ask the coordinator to relay ------------------------------------------------------

async def camera_snapshot(ctx: Ctx, args: LeaseId) -> bytes:
    """The current frame of the leased device's camera, as an image: see its screen (a boot
    menu, a panic, a login prompt) even when its OS is dead."""
    rules, caller = ctx.rules, ctx.caller
    lease = await rules.leases.reached(args.lease_id, caller)
    return await relays.camera_snapshot(lease, await rules.devices.host_address(lease["host"] or ""),
                                        rules.settings.private_addresses)


async def uart_exchange(ctx: Ctx, args: UartExchangeIn) -> dict:
    """Send text to the leased device's UART once (include the line ending, e.g. '\\r') and
    return what it printed within wait_s seconds (at most 10 s and 64 KiB). With until, a
    regular expression (e.g. '# $', a shell prompt), it answers as soon as the output matches.
    The answer: output, truncated (cut at 64 KiB), matched (whether until matched; false
    without one) and waited_s (how long it listened)."""
    lease = await ctx.rules.leases.reached(args.lease_id, ctx.caller)
    return await relays.uart_exchange(lease, args.send, args.wait_s, args.until)


async def exec_command(ctx: Ctx, args: ExecIn) -> ExecAnswer:
    """Run a shell command on the leased device and answer its stdout, stderr and exit status
    (127: no such command), through the device's own channel (adb shell, ssh, else its UART
    console): at most timeout_s seconds (120 at most; then it is interrupted) and 64 KiB of
    each output (truncated says it was cut). channel says which way it went."""
    lease = await ctx.rules.leases.reached(args.lease_id, ctx.caller)
    return await device_commands.exec_on(lease, args.command, args.timeout_s, ctx.rules.settings.ssh_logins,
                                         ctx.caller.name)


async def fingerprint(ctx: Ctx, args: LeaseId) -> dict:
    """What a reviewer needs to judge a number measured on the leased device, gathered by
    exec and from the lab: kernel, CPU model and ISA features (sve2, rvv, avx2...), cores,
    cpufreq governor and frequencies, thermal zones, memory, OS build, the image last
    flashed, its host and the device-loop version; emulated says its numbers are not for
    timing."""
    rules, caller = ctx.rules, ctx.caller
    lease = await rules.leases.reached(args.lease_id, caller)
    device = await rules.devices.device_info(lease["device"])
    return await device_commands.fingerprint(lease, dict(device), __version__, rules.settings.ssh_logins,
                                             caller.name)


# ---- jobs (docs/architecture.md, "Jobs and evidence") -------------------------------------------

async def submit_job(ctx: Ctx, args: SubmitJobIn) -> JobAnswer:
    """Submit a job (a spec, as a job file has it: what to run on, setup, the commands or an
    A/B pair, metrics, a matrix). It is queued until a device-loop worker that serves you takes
    it and runs its commands; follow it with job_status (wait_s) until it is done, failed or
    cancelled, then read job_evidence. An agent's job queues for devices as batch."""
    return await ctx.rules.jobs.submit(args.spec, args.claim, args.worker, ctx.caller, ticket_kind(ctx))


async def my_jobs(ctx: Ctx, args: JobFilter) -> list[dict[str, Any]]:
    """The caller's jobs (those they own or work on), open ones first (an admin's all=true: everyone's)."""
    return await ctx.rules.jobs.jobs(ctx.caller.name, args.everyone and ctx.caller.may_see_all)


async def job_status(ctx: Ctx, args: JobWait) -> JobAnswer:
    """A job: state (queued, running, done, failed, cancelled) and reason, its spec, cells
    (device, fingerprint), runs, the tickets and leases it made, and the analysis of its runs.
    With wait_s, answers once its state changes."""
    job = await ctx.rules.jobs.status(args.job_id, ctx.caller, await _until(ctx, args.wait_s),
                                      args.unless, ctx.gone)
    if not args.runs:
        job["runs"], job["runs_next"] = [], None
    return job


async def job_runs(ctx: Ctx, args: JobRunsPage) -> JobRunsAnswer:
    """A page of a job's runs in order (cell, attempt, seq): at most limit, after the cursor
    after (job_status's runs_next, or this call's next); next is where the following page
    begins, null after the last."""
    return await ctx.rules.jobs.runs_page(args.job_id, ctx.caller, args.after, args.limit)


async def delete_job(ctx: Ctx, args: JobId) -> dict:
    """Delete an ended job (done, failed or cancelled) with its cells and runs, for good (its
    owner, or an admin): its runs no longer count against the owner's stored runs."""
    return await ctx.rules.jobs.delete(args.job_id, ctx.caller)


async def job_evidence(ctx: Ctx, args: JobId) -> str:
    """The job's evidence, as markdown to paste into a review: the claim as numbers, the
    table per cell with intervals and verdicts, every device's fingerprint, each run's start
    time and temperature, the exact commands and spec, and how to reproduce it."""
    return await evidence_markdown(ctx.rules.jobs, args.job_id, ctx.caller)


async def claim_job(ctx: Ctx, args: ClaimJobIn) -> ClaimAnswer:
    """A worker takes the oldest queued job of the users it serves (its own token's user by
    default; others only with an admin's token): it is running from now on, and the worker
    beats. With wait_s, answers as soon as one is queued; job is null when none is."""
    return await ctx.rules.jobs.claim(args.users, args.worker, ctx.caller)


async def a_job_is_queued(ctx: Ctx, args: ClaimJobIn) -> None:
    await ctx.rules.jobs.wait_queued(args.users, await _until(ctx, args.wait_s), ctx.caller, ctx.gone)


async def beat_job(ctx: Ctx, args: JobId) -> dict[str, Any]:
    """The job's worker is alive (a running job whose worker is silent for the lab's
    --job-worker-timeout fails: worker lost)."""
    return await ctx.rules.jobs.beat(args.job_id, ctx.caller)


async def reserve_for_job(ctx: Ctx, args: JobReserveIn) -> LeaseAnswer | TicketAnswer:
    """A lease for one cell of a running job (held by its owner), or a queue ticket of the
    job's kind when nothing that matches is free: follow it with claim_ticket. A retry
    names the devices it leaves out (exclude)."""
    return await ctx.rules.jobs.reserve(args.job_id, args.cell, args.device, args.device_class, args.tags,
                                        ctx.caller, args.exclude)


async def report_cell(ctx: Ctx, args: JobId) -> dict[str, Any]:
    """A cell of a running job as its worker saw it (a CellReport: device, lease, fingerprint,
    or not_run with why)."""
    return await ctx.rules.jobs.report_cell(args.job_id, ctx.body, ctx.caller)


async def report_run(ctx: Ctx, args: JobId) -> dict[str, Any]:
    """One run of a running job (a RunRecord), as soon as it ended; runs are never changed."""
    return await ctx.rules.jobs.add_run(args.job_id, ctx.body, ctx.caller)


async def finish_job(ctx: Ctx, args: FinishJobIn) -> JobAnswer:
    """The worker says the job ended, done or failed (with why): its leases are released."""
    return await ctx.rules.jobs.finish(args.job_id, JobState(args.state), args.reason, ctx.caller)


async def cancel_job(ctx: Ctx, args: JobId) -> JobAnswer:
    """Cancel a queued or running job (its owner, or an admin): its tickets are cancelled and
    its leases released; the runs it has are kept."""
    return await ctx.rules.jobs.cancel(args.job_id, ctx.caller)


# ---- images ---------------------------------------------------------------------------------------

async def list_images(ctx: Ctx, args: ImageFilter) -> list[ImageAnswer]:
    """Images in the lab's registry (for a device and its class, if given): ref (name an
    image by it: sha256: and the start of its digest), name, sha256, size, and which devices
    or classes each is known-good for."""
    return await ctx.rules.images.list_images(args.device)


async def image_info(ctx: Ctx, args: ImageRefIn) -> ImageAnswer:
    """One image of the registry, by its ref or name."""
    return await ctx.rules.images.image_info(args.ref)


async def remove_image(ctx: Ctx, args: ImageRefIn) -> dict:
    """Remove an image (its uploader, or an admin); never the only known-good image of a target."""
    return await ctx.rules.images.remove_image(args.ref, ctx.caller)


async def upload_image(ctx: Ctx, args: UploadQuery) -> ImageAnswer:
    """The body is the image, streamed; what it is comes in the query string (name, for,
    description; sha256 and size if the uploader knows them)."""
    if ctx.stream is None:
        raise APIError(400, ErrorCode.BAD_REQUEST, "an upload's body is the image's bytes")
    image, new = await ctx.rules.images.upload(ctx.stream, args.name, args.target, args.description, args.sha256,
                                               args.size, ctx.caller.name)
    if not new:
        ctx.status = 200  # bytes the registry had already
    return image


async def image_content(ctx: Ctx, args: ImageOfHost) -> str:
    """An image's bytes, for the exporter of a host where an operation writes it."""
    return await ctx.rules.operations.image_for_host(args.host, args.sha256)


async def mark_image_good(ctx: Ctx, args: KnownGoodIn) -> ImageAnswer:
    """Mark an image known-good for a device or a class: recovery writes it."""
    return await ctx.rules.images.mark_good(args.ref, args.target, ctx.caller.name)


async def collect_images(ctx: Ctx, args: CollectIn) -> dict:
    """Remove the images that are not known-good and that nothing used for unused_days."""
    return await ctx.rules.images.collect_images(args.unused_days, ctx.caller.name)


# ---- admin -------------------------------------------------------------------------------------------

async def create_token(ctx: Ctx, args: TokenIn) -> TokenAnswer:
    """A token for a person or an exporter's host; the answer holds the token, shown this once."""
    rules = ctx.rules
    await rules.admin.judge_scope(args.scope)
    made = await issue_token(rules.store, rules.clock, args.user, args.admin, args.exporter_host, args.expires_s,
                             args.kind, args.scope, args.band)
    await rules.admin.record(ctx.caller.name, "token_create", {k: made[k] for k in ("id", "user", "admin", "host",
                                                                                   "kind", "scope", "band")})
    if ctx.caller.trusted:
        made["note"] = TRUST_MODE_TOKENS
    return made


async def set_token(ctx: Ctx, args: TokenSetIn) -> TokenAnswer:
    """Change a token's scope or band in place (the scope's fields given replace its own; unscoped takes the
    scope away): its next call is held to them, without a new token."""
    return token_view(await ctx.rules.admin.set_token(args.token_id, args.scope, args.band, args.unscoped,
                                                      ctx.caller.name))


async def list_tokens(ctx: Ctx, args: NoArgs) -> list[TokenAnswer]:
    """Every token (never its secret)."""
    return [token_view(row) for row in await ctx.rules.admin.tokens()]


async def revoke_token(ctx: Ctx, args: TokenId) -> dict:
    """Revoke a token at once."""
    return await ctx.rules.admin.revoke_token(args.token_id, ctx.caller.name)


async def revoke_lease(ctx: Ctx, args: LeaseId) -> LeaseAnswer:
    """Take a lease back from its holder (it ends as revoked)."""
    return await ctx.rules.leases.revoke(args.lease_id, ctx.caller.name)


async def retire_device(ctx: Ctx, args: RetireIn) -> DeviceAnswer:
    """Take a device out of the lab (a live lease is revoked only with force), or bring it back."""
    return await ctx.rules.admin.retire(args.device, ctx.caller.name, args.retired, args.force)


async def clear_fault(ctx: Ctx, args: AdminDevice) -> DeviceAnswer:
    """Clear a device's fault (a failed step's, a permanent health failure's, an admin's): it is idle again."""
    return await ctx.rules.admin.clear_fault(args.device, ctx.caller.name)


async def mark_faulty(ctx: Ctx, args: MarkFaultyIn) -> DeviceAnswer:
    """Mark a device faulty by hand, with why: it stays faulty until an admin clears the fault."""
    return await ctx.rules.admin.mark_faulty(args.device, args.reason, ctx.caller.name)


async def drain_host(ctx: Ctx, args: DrainIn) -> HostAnswer:
    """No new leases on a host's devices (live ones run out), or lift that."""
    return await ctx.rules.admin.drain(args.host, ctx.caller.name, args.draining)


async def forget(ctx: Ctx, args: ForgetIn) -> dict:
    """Delete an offline device nobody holds, or an offline host with its devices, for good
    (leases and the audit log keep their history)."""
    return await ctx.rules.admin.forget(args.name, args.kind, ctx.caller.name)


async def audit_log(ctx: Ctx, args: NoArgs) -> list[AuditEntry]:
    """The last 100 entries of the audit log."""
    return await ctx.rules.devices.audit()


async def list_candidates(ctx: Ctx, args: NoArgs) -> list[CandidateAnswer]:
    """What exporters found on the network, and what admins adopted."""
    return await ctx.rules.devices.candidates()


async def adopt_candidate(ctx: Ctx, args: AdoptIn) -> dict:
    """Make a network candidate a device, named as given, of the host that found it."""
    return await ctx.rules.admin.adopt(args.identifier, args.name, args.device_class, args.tags, ctx.caller.name)


def _power_action(args: PowerIn) -> str:
    return POWER_OPERATION.format(action=PowerAction(args.action).value)


def _kind_started(args: OperationIn) -> str:
    """What ``start_operation`` needs: its kind, and for power the action (``power.cycle``); a
    power request without a valid action needs ``power``, which no scope lists (refused, never
    let through unchecked: its own check would answer it later)."""
    if args.kind != POWER_KIND:
        return args.kind
    action = args.args.get("action")
    return (POWER_OPERATION.format(action=action) if isinstance(action, str) and action in set(PowerAction)
            else POWER_KIND)


TRUST_MODE_TOKENS = ("this lab runs in the trust mode (device-loop up): it ignores tokens, so this one's scope and "
                     "budget bind nobody here (every local caller may do everything); it is used by a lab with "
                     "tokens on this database: device-loop up --tokens, or device-loop coordinator")


# The table: every call, who may make it, and where. Only the ANYONE rows take callers
# without a token (tests/test_access.py calls every route and tool to hold this table to it).
# A heartbeat of 1000 devices (the most a report has) with 4 resources each, their services
# and 1000 network finds is 2.3 MiB; every field at its bound would allow 37 MiB, which no host
# sends: 8 MiB.
_RATED = frozenset({429})  # a lease's operations: a burst, then a steady rate (operation_shares.py)
CALLS: list[Call] = [
    Call("health", ANYONE, health, answer=HealthAnswer, method="GET", path="/health", database=False),
    Call("list_devices", ANYONE, list_devices, DeviceFilter, list[DeviceAnswer], "GET", "/devices", tool=True,
         tool_key="devices"),
    Call("device_info", ANYONE, device_info, DeviceName, DeviceAnswer, "GET", "/devices/{name}", tool=True),
    Call("device_log", ANYONE, device_log, DeviceName, list[LogEntry], "GET", "/devices/{name}/log", tool=True,
         tool_key="entries"),
    Call("device_operations", ANYONE, device_operations, DeviceOperations, list[OperationAnswer],
         "GET", "/devices/{name}/operations", tool=True, tool_key="operations"),
    Call("device_flashes", ANYONE, device_flashes, DeviceName, list[OperationAnswer],
         "GET", "/devices/{name}/flashes"),
    Call("list_hosts", ANYONE, list_hosts, answer=list[HostAnswer], method="GET", path="/hosts"),
    Call("heartbeat", EXPORTER, heartbeat, HostName, DesiredState, "POST", "/hosts/{name}/heartbeat",
         body=Heartbeat, max_body=8 << 20),
    Call("desired", EXPORTER, desired, DesiredWait, DesiredState, "GET", "/hosts/{name}/desired"),
    Call("image_content", EXPORTER, image_content, ImageOfHost, bytes, "GET", "/hosts/{name}/images/{sha256}",
         refusals=frozenset({410})),  # only images its own operations write
    Call("reserve", USER, reserve, ReserveIn, LeaseAnswer | TicketAnswer, "POST", "/leases", tool=True,
         status=201, idempotent=True, refusals=frozenset({404})),  # a device or an image it names
    Call("ticket_status", USER, ticket_status, TicketWait, TicketAnswer, "GET", "/tickets/{ticket_id}", tool=True),
    Call("claim_ticket", USER, claim_ticket, ClaimTicketIn, TicketAnswer, "POST", "/tickets/{ticket_id}/claim",
         tool=True, idempotent=True),
    Call("cancel_ticket", USER, cancel_ticket, TicketId, TicketAnswer, "POST", "/tickets/{ticket_id}/cancel",
         tool=True, idempotent=True),
    Call("my_tickets", USER, my_tickets, TicketFilter, list[TicketAnswer], "GET", "/tickets", tool=True,
         tool_key="tickets"),
    Call("queue_board", ANYONE, queue_board, answer=list[QueueEntry], method="GET", path="/queue"),
    Call("whoami", USER, whoami, answer=WhoamiAnswer, method="GET", path="/whoami", tool=True,
         aliases=("my_budget",)),
    Call("my_leases", USER, my_leases, MyLeases, list[LeaseAnswer], "GET", "/leases"),
    Call("lease_status", USER, lease_status, LeaseWait, LeaseAnswer, "GET", "/leases/{lease_id}", tool=True),
    Call("lease_cdi", USER, lease_cdi, LeaseId, CdiAnswer, "GET", "/leases/{lease_id}/cdi", tool=True,
         refusals=frozenset({409})),
    Call("renew", USER, renew, RenewIn, LeaseAnswer, "POST", "/leases/{lease_id}/renew", tool=True,
         idempotent=True),
    Call("release", USER, release, LeaseId, LeaseAnswer, "POST", "/leases/{lease_id}/release", tool=True,
         idempotent=True),
    Call("start_operation", USER, start_operation, OperationIn, OperationAnswer,
         "POST", "/leases/{lease_id}/operations", tool=True, status=201, idempotent=True, needs=_kind_started,
         refusals=_RATED),
    Call("flash", USER, flash, FlashIn, OperationAnswer, "POST", "/leases/{lease_id}/flash", tool=True,
         status=201, idempotent=True, needs=FLASH_KIND, refusals=_RATED),
    Call("recover", USER, recover, LeaseId, OperationAnswer, "POST", "/leases/{lease_id}/recover", tool=True,
         status=201, idempotent=True, needs="recover", refusals=_RATED),
    Call("operation_status", USER, operation_status, OpWait, OperationAnswer, "GET", "/ops/{op_id}", tool=True,
         aliases=("flash_status",)),
    Call("settle", USER, settle, LeaseId, OperationAnswer, "POST", "/leases/{lease_id}/settle", tool=True,
         status=201, idempotent=True, needs=SETTLE_KIND, refusals=_RATED),
    Call("power", USER, power, PowerIn, OperationAnswer, "POST", "/leases/{lease_id}/power", tool=True,
         status=201, idempotent=True, needs=_power_action, refusals=_RATED),
    Call("camera_snapshot", USER, camera_snapshot, LeaseId, bytes, tool=True, needs="camera"),
    Call("uart_exchange", USER, uart_exchange, UartExchangeIn, dict, tool=True, needs="uart"),
    Call("exec", USER, exec_command, ExecIn, ExecAnswer, tool=True, needs="exec"),
    Call("fingerprint", USER, fingerprint, LeaseId, dict, tool=True, needs="fingerprint"),
    Call("submit_job", USER, submit_job, SubmitJobIn, JobAnswer, "POST", "/jobs", tool=True, status=201,
         idempotent=True, needs="job"),
    Call("my_jobs", USER, my_jobs, JobFilter, list[JobSummary], "GET", "/jobs", tool_key="jobs"),
    Call("claim_job", USER, claim_job, ClaimJobIn, ClaimAnswer, "POST", "/jobs/claim", idempotent=True,
         ready=a_job_is_queued, needs="job"),
    Call("job_status", USER, job_status, JobWait, JobAnswer, "GET", "/jobs/{job_id}", tool=True),
    Call("job_runs", USER, job_runs, JobRunsPage, JobRunsAnswer, "GET", "/jobs/{job_id}/runs", tool=True),
    Call("delete_job", USER, delete_job, JobId, dict, "POST", "/jobs/{job_id}/delete", tool=True, idempotent=True),
    Call("job_evidence", USER, job_evidence, JobId, str, "GET", "/jobs/{job_id}/evidence", tool=True,
         media_type="text/markdown; charset=utf-8"),
    Call("beat_job", USER, beat_job, JobId, JobSummary, "POST", "/jobs/{job_id}/beat", needs="job"),
    Call("reserve_for_job", USER, reserve_for_job, JobReserveIn, LeaseAnswer | TicketAnswer,
         "POST", "/jobs/{job_id}/reserve", status=201, idempotent=True, needs="job"),
    Call("report_cell", USER, report_cell, JobId, CellReport, "POST", "/jobs/{job_id}/cells", idempotent=True,
         needs="job", body=CellReport, max_body=1 << 20),  # a fingerprint: 64 plugin fields of 4000 characters,
    #                                                         512 ISA flags
    Call("report_run", USER, report_run, JobId, RunRecord, "POST", "/jobs/{job_id}/runs", status=201,
         idempotent=True, body=RunRecord, max_body=128 << 10, needs="job"),  # its output's tail, readings, 16 samples
    Call("finish_job", USER, finish_job, FinishJobIn, JobAnswer, "POST", "/jobs/{job_id}/finish",
         idempotent=True, needs="job"),
    Call("cancel_job", USER, cancel_job, JobId, JobAnswer, "POST", "/jobs/{job_id}/cancel", idempotent=True),
    Call("upload_image", USER, upload_image, UploadQuery, ImageAnswer, "POST", "/images", status=201, streamed=True,
         refusals=frozenset({404, 507}), needs="image"),  # what it is for may not exist; a full disk
    Call("list_images", USER, list_images, ImageFilter, list[ImageAnswer], "GET", "/images", tool=True,
         tool_key="images", refusals=frozenset({404})),  # what it names in the query may not exist
    Call("image_info", USER, image_info, ImageRefIn, ImageAnswer, "GET", "/images/{ref}",
         refusals=frozenset({409, 422})),  # a reference may name several images, or be malformed
    Call("remove_image", USER, remove_image, ImageRefIn, dict, "POST", "/images/{ref}/remove", idempotent=True,
         needs="image"),
    Call("create_token", ADMIN, create_token, TokenIn, TokenAnswer, "POST", "/admin/tokens", status=201,
         idempotent=True),
    Call("list_tokens", ADMIN, list_tokens, answer=list[TokenAnswer], method="GET", path="/admin/tokens"),
    Call("set_token", ADMIN, set_token, TokenSetIn, TokenAnswer, "POST", "/admin/tokens/{token_id}",
         idempotent=True),
    Call("revoke_token", ADMIN, revoke_token, TokenId, dict, "POST", "/admin/tokens/{token_id}/revoke",
         idempotent=True),
    Call("revoke_lease", ADMIN, revoke_lease, LeaseId, LeaseAnswer, "POST", "/admin/leases/{lease_id}/revoke",
         idempotent=True),
    Call("retire_device", ADMIN, retire_device, RetireIn, DeviceAnswer, "POST", "/admin/devices/{device}/retire",
         idempotent=True),
    Call("recover_unleased", ADMIN, recover_unleased, AdminDevice, OperationAnswer,
         "POST", "/admin/devices/{device}/recover", status=201, idempotent=True),
    Call("power_unleased", ADMIN, power_unleased, AdminPowerIn, OperationAnswer,
         "POST", "/admin/devices/{device}/power", status=201, idempotent=True),
    Call("clear_fault", ADMIN, clear_fault, AdminDevice, DeviceAnswer,
         "POST", "/admin/devices/{device}/clear-fault", idempotent=True),
    Call("kill_orphans", ADMIN, kill_orphans, AdminDevice, OperationAnswer,
         "POST", "/admin/devices/{device}/orphans/kill", status=201, idempotent=True),
    Call("mark_faulty", ADMIN, mark_faulty, MarkFaultyIn, DeviceAnswer, "POST", "/admin/devices/{device}/fault",
         idempotent=True),
    Call("drain_host", ADMIN, drain_host, DrainIn, HostAnswer, "POST", "/admin/hosts/{host}/drain",
         idempotent=True),
    Call("forget", ADMIN, forget, ForgetIn, dict, "POST", "/admin/forget", idempotent=True,
         refusals=frozenset({404})),  # what it names may not exist
    Call("audit_log", ADMIN, audit_log, answer=list[AuditEntry], method="GET", path="/admin/audit"),
    Call("list_candidates", ADMIN, list_candidates, NoArgs, list[CandidateAnswer], "GET", "/admin/candidates"),
    Call("adopt_candidate", ADMIN, adopt_candidate, AdoptIn, dict,
         "POST", "/admin/candidates/{identifier:path}/adopt", status=201, idempotent=True),
    Call("mark_image_good", ADMIN, mark_image_good, KnownGoodIn, ImageAnswer,
         "POST", "/admin/images/{ref}/known-good", idempotent=True),
    Call("collect_images", ADMIN, collect_images, CollectIn, dict, "POST", "/admin/images/gc", idempotent=True),
]
BY_NAME = {call.name: call for call in CALLS}
TOOLS = [call for call in CALLS if call.tool]
