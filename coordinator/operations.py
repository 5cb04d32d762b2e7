"""Operations on a device (docs/architecture.md "Operations"): one shape for every kind.

A lease's holder (or an admin) asks for an operation of a kind the device's exporter said
one of its resources runs (``ResourceReport.operations``); the coordinator checks the lease
and the arguments, writes the audit record and puts the operation in its host's desired
state; the exporter runs it and its heartbeats carry progress and result back. At most one
*exclusive* operation runs on a device at a time (a partial UNIQUE index), and a device
takes no new lease while one does.

A *destructive* operation that fails after it began changing the device (or is interrupted
then: its exporter restarted) leaves the device ``needs_recovery``, a sticky flag: no new
lease is granted until it is recovered. The one kind the coordinator mediates further is
``flash`` (the image registry's): its image is resolved here and fetched by the exporter,
and a flash of a known-good image that succeeds clears the flag (``recover``).
"""
from __future__ import annotations

import secrets
from typing import Any, Awaitable, Callable

from pydantic import TypeAdapter, ValidationError

from device_loop.core import FLASH_KIND, OP_PREFIX, ORPHANS_KIND, REFLASH_STEP
from device_loop.core.durations import iso
from device_loop.core.protocol import EXPORTER_STEPS, Args, Heartbeat, OperationReport, Progress
from device_loop.core.vocabulary import FIRST_PHASES, LIVE_OP_STATES, OperationState, Purpose

from device_loop.core.answers import OperationAnswer
from device_loop.core.errors import ErrorCode
from . import kinds
from .operation_shares import LeaseBuckets, status_only
from .errors import APIError, conflict, not_found
from .hidden_paths import hide_paths_in
from .images import Images
from .leases import Leases
from .lifecycle import Lifecycle
from .notify import BOARD_KEY, host_key, op_key
from .rows import DeviceFacts, HostRow, ImageRow, OperationRow
from .store import Store, UniqueViolation
from .who import Who
from .store.devices import DeviceQueries
from .store.images import ImageQueries
from .store.leases import LeaseQueries
from .store.operations import OperationQueries

_ARGS = TypeAdapter(Args)


def op_json(op: OperationRow, theirs: bool = False, host_online: bool | None = True) -> OperationAnswer:
    """An operation as anyone in the lab sees it. Only ``theirs`` (its requester, its lease's
    holder, admins) see its lease (private, as lease ids are) and the exporter's file paths
    in what it said (``hidden_paths.py``)."""
    shown = (lambda value: value) if theirs else hide_paths_in
    answer: OperationAnswer = {
        "id": op["id"], "kind": op["kind"], "device": op["device"], "host": op["host"],
        "lease": op["lease_id"] if theirs else None, "requester": op["requester"], "args": op["args"],
        "state": op["state"], "phase": op["phase"],
        "progress": {"done": op["progress_done"], "total": op["progress_total"], "unit": op["progress_unit"],
                     "detail": shown(op["progress_detail"])},
        "message": shown(op["message"]), "result": shown(op["result"]), "seconds": op["seconds"],
        "created_at": iso(op["created_at"]), "started_at": iso(op["started_at"]), "ended_at": iso(op["ended_at"]),
    }
    if op["image_sha256"]:  # as flashes always showed it
        answer |= {"purpose": op["args"].get("purpose", op["kind"]),
                   "image": {"name": op["image_name"], "sha256": op["image_sha256"], "size": op["image_size"]},
                   "done_bytes": op["progress_done"], "total_bytes": op["progress_total"],
                   "verified": bool(op["verified"])}
    if op["state"] in LIVE_OP_STATES and host_online is False:
        answer["message"] = f"host {op['host']} is offline: the operation goes on when its exporter is back"
    return answer


def read_back(op: OperationRow, seen: OperationReport) -> bool:
    """Whether ``op`` wrote its image and read it back: a flash that ended done whose result
    says ``verified`` with the digest it read, the image's (docs/architecture.md, "Leases that
    live as long as their client": what a reserve's ``--image`` prefers, never a label)."""
    result = seen.result or {}
    return (op["kind"] == FLASH_KIND and seen.state == OperationState.DONE and op["image_sha256"] is not None
            and result.get("verified") is True and result.get("sha256") == op["image_sha256"])


def kinds_of(device: DeviceFacts) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """The operation kinds a device's resources run: kind -> (that kind's report, the resource)."""
    return {kind["kind"]: (kind, resource) for resource in device["resources"]
            for kind in resource.get("operations", [])}


class Operations:
    """Starting operations, following them, and taking what exporters report of them."""

    def __init__(self, life: Lifecycle, leases: Leases, images: Images, *,
                 operations_sql: OperationQueries, devices_sql: DeviceQueries, leases_sql: LeaseQueries,
                 images_sql: ImageQueries):
        self.life, self.leases, self.images = life, leases, images
        self.store: Store = life.store
        self.operations_sql = operations_sql
        self.devices_sql = devices_sql
        self.leases_sql = leases_sql
        self.images_sql = images_sql
        # kind -> how a lease's holder's request of it starts, where it is not the plain way (a flash names an
        # image of the registry, resolved here): one entry a kind (docs/architecture.md, "Operations")
        self.starters: dict[str, Callable[[str, dict[str, Any], Who], Awaitable[OperationAnswer]]] = {
            FLASH_KIND: self._flash_asked}
        # how fast each lease starts operations (docs/architecture.md, "Shares of one lab")
        self.buckets = LeaseBuckets()

    # ---- starting one -----------------------------------------------------------------------

    async def start(self, lease_id: str, kind: str, args: dict[str, Any], who: Who) -> OperationAnswer:
        """Start an operation of ``kind`` with ``args`` on the device of ``lease_id`` (a
        ``flash`` names its image in ``args["image"]``)."""
        if kind in self.starters:
            return await self.starters[kind](lease_id, args, who)
        async with self.store.tx():
            device = await self._leased_device(lease_id, who, f"run {kind} on it")
            return await self._start(device, kind, args, lease_id, who.name)

    async def _flash_asked(self, lease_id: str, args: dict[str, Any], who: Who) -> OperationAnswer:
        image = args.get("image")
        if not isinstance(image, str) or set(args) - {"image"}:
            raise APIError(422, ErrorCode.INVALID, "a flash takes one argument, image: the image's ref or name "
                                                   "(device-loop images ls)")
        return await self.flash(lease_id, image, who)

    async def flash(self, lease_id: str, image_ref: str, who: Who) -> OperationAnswer:
        """Flash ``image_ref`` (``images.parse_ref``) onto the device of ``lease_id``."""
        async with self.store.tx():
            device = await self._leased_device(lease_id, who, "flash it")
            image = await self.images.image(image_ref, {f"device:{device['name']}", f"class:{device['class']}"})
            return await self._start_flash(device, image, lease_id, who.name, FLASH_KIND)

    async def recover(self, lease_id: str, who: Who) -> OperationAnswer:
        """Flash the latest known-good image of the lease's device (else of its class)."""
        async with self.store.tx():
            device = await self._leased_device(lease_id, who, "recover it")
            return await self._start_flash(device, await self._known_good(device), lease_id, who.name, "recover")

    async def recover_unleased(self, name: str, admin: str) -> OperationAnswer:
        """An admin recovers a device nobody holds (its holder gave it back broken)."""
        async with self.store.tx():
            device = await self.devices_sql.device(name)
            if device is None:
                raise not_found("device", name)
            if device["lease_id"] and device["holder"] != admin:
                raise conflict(ErrorCode.LEASED, f"{name} is held by {device['holder']}: they recover it, or revoke "
                                                 f"their lease first (device-loop admin release --force "
                                                 f"{device['lease_id']})")
            return await self._start_flash(device, await self._known_good(device), device["lease_id"], admin,
                                           "recover")

    async def start_unleased(self, name: str, kind: str, args: dict[str, Any], admin: str) -> OperationAnswer:
        """An admin starts an operation on a device nobody holds (a hung board to switch off
        and on); a device held by another is theirs to operate."""
        async with self.store.tx():
            device = await self.devices_sql.device(name)
            if device is None:
                raise not_found("device", name)
            if device["lease_id"] and device["holder"] != admin:
                raise conflict(ErrorCode.LEASED, f"{name} is held by {device['holder']}: they run {kind} on it, or an "
                                                 f"admin revokes their lease first (device-loop admin release --force "
                                                 f"{device['lease_id']})")
            return await self._start(device, kind, args, device["lease_id"], admin)

    async def kill_orphans(self, name: str, admin: str) -> OperationAnswer:
        """An admin has the device's exporter kill the processes its last report says hold the
        device's node after its lease ended (docs/architecture.md, "Containers and CDI"): an
        operation of the exporter's own, which kills only the orphans it sees itself then, each
        checked again; never a pid from here."""
        async with self.store.tx():
            device = await self.devices_sql.device(name)
            if device is None:
                raise not_found("device", name)
            if device["lease_id"]:
                raise conflict(ErrorCode.LEASED, f"{name} is leased to {device['holder']}: what holds its node now "
                                                 f"is theirs, not an orphan (orphans are what still holds it after "
                                                 f"the lease ended)")
            if not device["busy_by"]:
                raise conflict(ErrorCode.NO_ORPHANS, f"{name}'s exporter reports no process holding its node")
            if not (device["host_online"] and device["present"]) or not device["resources"]:
                raise conflict(ErrorCode.OFFLINE, f"{name} is offline (host {device['host']}): its exporter kills "
                                                  f"nothing now")
            first = device["resources"][0]
            reported = [{"pid": h.get("pid"), "cgroup": h.get("cgroup", "")} for h in device["busy_by"]]
            return await self.queue(device, ORPHANS_KIND, first["identifier"], EXPORTER_STEPS, {}, None, admin,
                                    exclusive=False, destructive=False, purpose=Purpose.RECOVERY,
                                    action="kill_orphans", audit={"reported": reported})

    async def _leased_device(self, lease_id: str, who: Who, doing: str) -> DeviceFacts:
        view = await self.leases.live_view(lease_id, who, doing)
        device = await self.devices_sql.device(view["device"])
        if device is None:
            raise not_found("device", view["device"])
        return device

    async def _known_good(self, device: DeviceFacts) -> ImageRow:
        image = await self.images.known_good_image(device)
        if image is not None:
            return image
        raise conflict(ErrorCode.NO_KNOWN_GOOD, f"no image is known-good for {device['name']} or its class "
                                                f"{device['class']}: an admin marks one (device-loop images mark-good)")

    async def reflash(self, device: DeviceFacts, requester: str, step: int, audit: dict[str, Any]) -> OperationAnswer:
        """Write the device's latest known-good image back (the ``reflash`` step between
        leases at place ``step``, audited with ``audit``: its cause); refused when none is known-good."""
        return await self._start_flash(device, await self._known_good(device), None, requester, REFLASH_STEP, audit,
                                       step=step)

    async def _start_flash(self, device: DeviceFacts, image: ImageRow, lease_id: str | None, caller: str,
                           purpose: str, audit: dict[str, Any] | None = None,
                           step: int | None = None) -> OperationAnswer:
        name = device["name"]
        fits = {f"device:{name}", f"class:{device['class']}"}
        if image["target"] not in fits and not fits & set(await self.images_sql.known_good_targets(image["sha256"])):
            raise conflict(ErrorCode.IMAGE_NOT_FOR_DEVICE,
                           f"image {image['name']!r} is for {image['target']}, not for {name} (class "
                           f"{device['class']}); an admin can mark it known-good for {name}")
        await self.images_sql.set_image_used(image["sha256"], self.life.clock())
        return await self._start(device, FLASH_KIND, {"purpose": purpose}, lease_id, caller, image, action=purpose,
                                 audit=audit, step=step)

    async def _start(self, device: DeviceFacts, kind: str, args: dict[str, Any], lease_id: str | None, caller: str,
                     image: ImageRow | None = None, action: str | None = None,
                     audit: dict[str, Any] | None = None, step: int | None = None) -> OperationAnswer:
        """Queue the operation for the device's exporter (in the caller's transaction): a step
        between leases (at place ``step``), else one asked for in a lease, else (no lease) a
        recovery."""
        name = device["name"]
        offered = kinds_of(device)
        if kind not in offered:
            words = kinds.of(kind)
            if words.missing is not None:
                raise conflict(words.missing_code, words.missing.format(device=name))
            raise conflict(ErrorCode.NO_SUCH_OPERATION, f"{name} runs no operation {kind!r}; it runs: "
                                                        f"{', '.join(sorted(offered)) or 'none'}")
        spec, resource = offered[kind]
        if image is None:
            args = self._checked_args(kind, spec, args)
        if lease_id is not None and step is None:
            live = await self.shared(kind, args, lease_id, name)
            if live is not None:
                return live
        if not (device["host_online"] and device["present"]):
            raise conflict(ErrorCode.OFFLINE, f"{name} is offline (host {device['host']}): nothing runs on it now")
        if spec.get("exclusive", True) and device["op_id"]:
            raise self._busy(name, device["op_id"], device["op_kind"])
        if lease_id is not None and step is None:  # (what is refused above spends nothing of its share)
            self.take_share(lease_id)
        purpose = Purpose.STEP if step is not None else Purpose.LEASE if lease_id else Purpose.RECOVERY
        return await self.queue(device, kind, resource["identifier"], resource["plugin"], args, lease_id, caller,
                                exclusive=spec.get("exclusive", True), destructive=spec.get("destructive", False),
                                image=image, action=action, audit=audit, purpose=purpose, step=step)

    async def shared(self, kind: str, args: dict[str, Any], lease_id: str, device: str) -> OperationAnswer | None:
        """What a lease's holder's request of ``kind`` on ``device`` takes of its share
        (docs/architecture.md, "Shares of one lab"): a status-only one while one of its kind is
        live on the lease is answered by that one (returned: nothing is started); any other,
        once it may start, spends one of the lease's operations (``LeaseBuckets``: past them, 429)."""
        if status_only(kind, args):
            # two at once in two processes would each find none live: its host's lock, the
            # first of the lock order (docs/architecture.md, "Leases"), makes them take turns
            await self.leases_sql.lock_host_of_device(device)
            for live in await self.operations_sql.live_operations_of_lease(lease_id, kind):
                if status_only(live["kind"], live["args"]) and live["args"] == args:
                    return op_json(live, theirs=True)
        return None

    def take_share(self, lease_id: str) -> None:
        """Spend one of the lease's operations (``LeaseBuckets``: past them, 429
        ``too_many_operations``): what every operation a holder starts does, once nothing else
        refuses it (docs/architecture.md, "Shares of one lab")."""
        self.buckets.take(lease_id, self.life.clock())

    async def prune(self, now: float, batch: int, batches: int) -> None:
        """Operations that ended longer ago than the lab keeps them (``operation_retention_s``)
        go, ``batch`` a transaction (the writer is not held for long), at most ``batches`` of
        them: the rest at the next pass (docs/architecture.md, "Shares of one lab")."""
        kept_s = self.life.settings.operation_retention_s
        if kept_s is not None:
            await self.life.prune_in_batches(self.operations_sql.prune_operations, now - kept_s, batch, batches)

    async def queue(self, device: DeviceFacts, kind: str, identifier: str, plugin: str, args: dict[str, Any],
                    lease_id: str | None, requester: str, *, exclusive: bool, destructive: bool, purpose: Purpose,
                    step: int | None = None, image: ImageRow | None = None, action: str | None = None,
                    audit: dict[str, Any] | None = None) -> OperationAnswer:
        """Queue an operation for the device's exporter, audited (as ``action``, with
        ``audit`` in its detail), in the caller's transaction: what ``start`` and the
        coordinator's own operations (steps between leases, settle) have in common."""
        name = device["name"]
        now = self.life.clock()
        op: OperationRow = {
            "id": OP_PREFIX + secrets.token_hex(8), "kind": kind, "device": name, "host": device["host"] or "",
            "lease_id": lease_id, "requester": requester, "identifier": identifier, "plugin": plugin,
            "exclusive": exclusive, "destructive": destructive, "args": args,
            "image_sha256": image["sha256"] if image else None, "image_name": image["name"] if image else None,
            "image_size": image["size"] if image else None, "state": OperationState.QUEUED, "phase": "queued",
            "progress_done": 0, "progress_total": image["size"] if image else None,
            "progress_unit": "bytes" if image else "", "progress_detail": "", "message": "", "seconds": {},
            "result": None, "verified": False, "boot_id": None, "interrupted": False, "purpose": purpose, "step": step,
            "audit_id": None, "created_at": now,
            "started_at": None, "ended_at": None}
        detail: dict[str, Any] = {"op": op["id"], "kind": kind, "args": args, **(audit or {})}
        if image:
            detail |= {"image": image["name"], "sha256": image["sha256"], "size": image["size"]}
        op["audit_id"] = await self.life.audit(requester, action or kind, name, lease_id, detail)
        try:
            await self.operations_sql.insert_operation(op)
        except UniqueViolation:  # another coordinator process started one a moment ago
            raise self._busy(name, "another operation", None) from None
        self.life.notify(host_key(op["host"]), BOARD_KEY)  # the board shows it busy
        return op_json(op, theirs=True)

    @staticmethod
    def _checked_args(kind: str, spec: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
        """``args`` as the protocol bounds them, and only those the kind takes."""
        known = spec.get("args", {})
        unknown = sorted(set(args) - set(known))
        if unknown:
            takes = ", ".join(f"{name} ({what})" for name, what in sorted(known.items())) or "no arguments"
            raise APIError(422, ErrorCode.INVALID, f"{kind} takes {takes}; not {', '.join(unknown)}")
        try:
            return _ARGS.validate_python(args)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"])) or "args"
            raise APIError(422, ErrorCode.INVALID, f"args.{where}: {first['msg']}") from None

    @staticmethod
    def _busy(name: str, op_id: str, kind: str | None) -> APIError:
        words = kinds.of(kind)
        return conflict(words.busy_code, f"{name} is being {words.doing} already ({op_id}): one at a time (follow it "
                                         f"with 'device-loop op {op_id} --wait', or the operation_status tool)")

    # ---- following them ---------------------------------------------------------------------

    async def op(self, op_id: str, who: Who | None = None) -> OperationAnswer:
        """An operation as ``who`` sees it (``_ops_json``)."""
        op = await self.operations_sql.operation(op_id)
        if op is None:
            raise not_found("operation", op_id)
        return (await self._ops_json([op], who))[0]

    async def wait(self, op_id: str, unless_state: str | None, wait_s: float, gone: Callable[[], Awaitable[None]], *,
                   who: Who | None = None) -> OperationAnswer:
        """Long-poll: the operation once its state is not ``unless_state`` (or ``wait_s`` passed)."""
        return await self.life.notifier.long_poll(op_key(op_id), lambda: self.op(op_id, who),
                                                  lambda op: op["state"] != unless_state, wait_s, gone)

    async def of_device(self, name: str, limit: int = 20, kind: str | None = None, *,
                        who: Who | None = None) -> list[OperationAnswer]:
        """A device's latest operations (of ``kind``), newest first, as ``who`` sees them."""
        if await self.devices_sql.device(name) is None:
            raise not_found("device", name)
        return await self._ops_json(await self.operations_sql.operations_of_device(name, limit, kind), who)

    async def _ops_json(self, ops: list[Any], who: Who | None) -> list[OperationAnswer]:
        """``ops`` with the lease of each (and the paths in what it said) shown only to who may
        see it: whoever may see all, the one who asked for the operation, and the holder of its
        lease (``who`` None: nobody; docs/architecture.md, "Who may act on what")."""
        if who is None:
            return [op_json(op, False, op.get("host_online", True)) for op in ops]
        holders: dict[str, str] = {}
        if not who.may_see_all:
            others = [op["lease_id"] for op in ops if op["lease_id"] and op["requester"] != who.name]
            holders = await self.leases_sql.lease_holders(others) if others else {}
        return [op_json(op, who.may_see_all or who.may_act_on(op["requester"], holders.get(op["lease_id"])),
                        op.get("host_online", True)) for op in ops]

    async def image_for_host(self, host: str, sha256: str) -> str:
        """The file of an image that a live operation on ``host`` writes (exporters fetch only those)."""
        if not await self.operations_sql.live_image_uses(sha256, host):
            raise APIError(404, ErrorCode.UNKNOWN_IMAGE, f"no operation on host {host} writes image {sha256}")
        path = self.images.image_files.path(sha256)
        if not path.exists():
            raise APIError(410, ErrorCode.IMAGE_FILE_GONE, f"the registry lost the file of image {sha256}")
        return str(path)

    # ---- what exporters report ----------------------------------------------------------------

    async def apply_reports(self, host_name: str, previous: HostRow | None, report: Heartbeat,
                            actor: str) -> list[OperationRow]:
        """Progress and results of this host's operations; an operation its exporter was
        running when it restarted is interrupted. Nothing is read when neither happened.
        Returns the operations that ended (what steps between leases and grants follow)."""
        reported = {r.op: r for r in report.operations}
        restarted = previous is not None and previous["boot_id"] != report.boot_id
        if not reported and not restarted:
            return []
        now = self.life.clock()
        ended: list[OperationRow] = []
        for op in await self.operations_sql.operations_to_update(host_name, list(reported), restarted, report.boot_id):
            if op["state"] not in LIVE_OP_STATES:
                continue  # a result reported again, before the exporter saw it acknowledged
            seen = reported.get(op["id"]) or self._interrupted(op, host_name)
            fields: dict[str, Any] = {
                "state": seen.state, "phase": seen.phase, "progress_done": seen.progress.done,
                "progress_total": seen.progress.total if seen.progress.total is not None else op["progress_total"],
                "progress_unit": seen.progress.unit or op["progress_unit"], "progress_detail": seen.progress.detail,
                "message": seen.message,
                "seconds": {k: round(v, 3) for k, v in seen.seconds.items()}, "result": seen.result,
                "verified": read_back(op, seen), "boot_id": report.boot_id, "interrupted": seen.interrupted}
            if all(op[k] == v for k, v in fields.items()):  # type: ignore[literal-required]
                continue
            fields["started_at"] = op["started_at"] or now
            if seen.state != OperationState.RUNNING:
                fields["ended_at"] = now
            await self.operations_sql.update_operation(op["id"], fields)
            if seen.state != OperationState.RUNNING:
                finished: OperationRow = {**op, **fields}  # type: ignore[typeddict-item]
                await self._finished(finished, seen.changed, actor)
                ended.append(finished)
            self.life.notify(op_key(op["id"]))
        return ended

    @staticmethod
    def _interrupted(op: OperationRow, host_name: str) -> OperationReport:
        """What an operation is once the exporter that ran it is gone (a later boot reports)."""
        changed = op["phase"] not in FIRST_PHASES
        return OperationReport(op=op["id"], device=op["device"], kind=op["kind"], state=OperationState.FAILED,
                               phase=op["phase"] if changed else "fetching" if op["image_sha256"] else op["phase"],
                               progress=Progress(done=op["progress_done"], total=op["progress_total"],
                                                 unit=op["progress_unit"]),
                               seconds=op["seconds"], changed=changed, interrupted=True,
                               message=f"interrupted: exporter {host_name} restarted during the {op['kind']}")

    async def _finished(self, op: OperationRow, changed: bool, actor: str) -> None:
        life = self.life
        detail: dict[str, Any] = {"op": op["id"], "kind": op["kind"], "message": op["message"]}
        if isinstance(op["result"], dict):  # what it found, its plain values (a power verdict and backend)
            detail["result"] = {k: v[:200] if isinstance(v, str) else v for k, v in list(op["result"].items())[:20]
                                if v is None or isinstance(v, (str, int, float, bool))}
        if op["image_sha256"]:
            detail |= {"image": op["image_name"], "sha256": op["image_sha256"]}
        action = f"{op['kind']}_{op['state']}"
        await life.audit(actor, action, op["device"], op["lease_id"], detail)
        life.notify(BOARD_KEY)  # no longer busy, perhaps needing recovery
        self.store.after_commit(life.metrics.operations.labels(kind=op["kind"], outcome=op["state"]).inc)
        device = await self.devices_sql.device(op["device"])
        if device is None:
            return
        if op["state"] == OperationState.FAILED and changed and op["destructive"]:
            what = f"{op['args'].get('purpose', op['kind'])} {op['id']}"
            what += f" of {op['image_name']}" if op["image_name"] else ""
            what += f" failed while {op['phase']}"
            await life.note(device, f"needs recovery: {what}", actor, needs_recovery=f"{what}: {op['message']}")
        elif op["state"] == OperationState.DONE and device["needs_recovery"] and op["image_sha256"]:
            good = await self.images_sql.known_good_targets(op["image_sha256"])
            if {f"device:{device['name']}", f"class:{device['class']}"} & set(good):
                await life.note(device, f"recovered by {op['id']} (known-good {op['image_name']})", actor,
                                needs_recovery=None)
