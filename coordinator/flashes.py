"""Mediated flash (DESIGN §6): the coordinator checks the lease and the image, writes the
audit record and hands the operation to the device's exporter in its desired state; the
exporter's heartbeats carry progress and result back.

A flash that fails while its target is being written (or is interrupted then: its
exporter restarted) leaves the device ``needs_recovery``, a sticky flag: no new lease is
granted until a known-good image was written to it (``recover``).
"""
from __future__ import annotations

import secrets

from device_loop.core import FLASH_KIND, LIVE_OP_STATES, OP_PREFIX, WRITING_PHASES
from device_loop.core.durations import iso
from device_loop.core.protocol import FlashReport, Heartbeat

from .errors import APIError, conflict, not_found
from .images import Images
from .lifecycle import ring_entry
from .notify import BOARD_KEY, host_key, op_key
from .store import LIVE, UniqueViolation
from .views import Views


def op_json(op: dict, lease_shown: bool = False) -> dict:
    """A flash operation as anyone in the lab sees it; its lease (private to its holder, as
    lease ids are) only with ``lease_shown``: for its requester, the lease's holder and admins."""
    answer = {
        "id": op["id"], "device": op["device"], "host": op["host"], "lease": op["lease_id"] if lease_shown else None,
        "requester": op["requester"], "purpose": op["purpose"],
        "image": {"name": op["image_name"], "sha256": op["sha256"], "size": op["size"]},
        "state": op["state"], "phase": op["phase"], "done_bytes": op["done_bytes"], "total_bytes": op["size"],
        "message": op["message"], "seconds": op["seconds"], "created_at": iso(op["created_at"]),
        "started_at": iso(op["started_at"]),
        "ended_at": iso(op["ended_at"]),
    }
    if op["state"] in LIVE_OP_STATES and not op.get("host_online", True):
        answer["message"] = f"host {op['host']} is offline: the flash goes on when its exporter is back"
    return answer


class Flashes(Images, Views):
    async def flash(self, lease_id: str, image_ref: str, caller: str, admin: bool = False) -> dict:
        """Flash ``image_ref`` (``images.parse_ref``) onto the device of ``lease_id``."""
        async with self.store.tx():
            device = await self._leased_device(lease_id, caller, admin)
            image = await self._image(image_ref, {f"device:{device['name']}", f"class:{device['class']}"})
            return await self._start(device, image, lease_id, caller, "flash")

    async def recover(self, lease_id: str, caller: str, admin: bool = False) -> dict:
        """Flash the latest known-good image of the lease's device (else of its class)."""
        async with self.store.tx():
            device = await self._leased_device(lease_id, caller, admin)
            return await self._start(device, await self._known_good(device), lease_id, caller, "recover")

    async def recover_unleased(self, name: str, admin: str) -> dict:
        """An admin recovers a device nobody holds (its holder gave it back broken)."""
        async with self.store.tx():
            device = await self.store.device(name)
            if device is None:
                raise not_found("device", name)
            if device["lease_id"] and device["holder"] != admin:
                raise conflict("leased", f"{name} is held by {device['holder']}: they recover it, or revoke "
                                         f"their lease first (device-loop admin release --force {device['lease_id']})")
            return await self._start(device, await self._known_good(device), device["lease_id"], admin, "recover")

    async def op(self, op_id: str, *, caller: str | None = None, admin: bool = False) -> dict:
        """An operation as ``caller`` sees it (``_ops_json``)."""
        op = await self.store.flash_op(op_id)
        if op is None:
            raise not_found("operation", op_id)
        return (await self._ops_json([op], caller, admin))[0]

    async def wait_op(self, op_id: str, unless_state: str | None, wait_s: float, gone, *, caller: str | None = None,
                      admin: bool = False) -> dict:
        """Long-poll: the operation once its state is not ``unless_state`` (or ``wait_s`` passed)."""
        return await self.notifier.long_poll(op_key(op_id), lambda: self.op(op_id, caller=caller, admin=admin),
                                             lambda op: op["state"] != unless_state, wait_s, gone)

    async def flashes_of(self, name: str, limit: int = 20, *, caller: str | None = None,
                         admin: bool = False) -> list[dict]:
        """A device's latest flash operations, newest first, as ``caller`` sees them (``_ops_json``)."""
        if await self.store.device(name) is None:
            raise not_found("device", name)
        return await self._ops_json(await self.store.flash_ops_of_device(name, limit), caller, admin)

    async def _ops_json(self, ops: list[dict], caller: str | None, admin: bool) -> list[dict]:
        """``ops`` with the lease of each shown only to who may see it: an admin, the one who
        asked for the flash, and the holder of its lease (``caller`` None: nobody)."""
        holders: dict[str, str] = {}
        if caller is not None and not admin:
            others = [op["lease_id"] for op in ops if op["lease_id"] and op["requester"] != caller]
            holders = await self.store.lease_holders(others) if others else {}
        return [op_json(op, admin or caller is not None and caller in (op["requester"], holders.get(op["lease_id"])))
                for op in ops]

    async def image_for_host(self, host: str, sha256: str) -> str:
        """The file of an image that a live flash on ``host`` writes (exporters fetch only those)."""
        if not await self.store.live_flash_uses(sha256, host):
            raise APIError(404, "unknown_image", f"no flash on host {host} writes image {sha256}")
        path = self.image_files.path(sha256)
        if not path.exists():
            raise APIError(410, "image_file_gone", f"the registry lost the file of image {sha256}")
        return str(path)

    # ---- starting one ---------------------------------------------------------------------

    async def _leased_device(self, lease_id: str, caller: str, admin: bool) -> dict:
        view = await self._own_lease_view(lease_id, caller, admin)
        if view["state"] not in LIVE:
            raise conflict("lease_ended", f"{lease_id} is {view['state']}: reserve {view['device']} again to flash it")
        return await self.store.device(view["device"])

    async def _known_good(self, device: dict) -> dict:
        image = await self.known_good_image(device)
        if image is not None:
            return image
        raise conflict("no_known_good", f"no image is known-good for {device['name']} or its class "
                                        f"{device['class']}: an admin marks one (device-loop images mark-good)")

    async def _start(self, device: dict, image: dict, lease_id: str | None, caller: str, purpose: str) -> dict:
        name = device["name"]
        target = next((r for r in device["resources"] if r["kind"] == FLASH_KIND), None)
        if target is None:
            raise conflict("no_flash_target", f"{name} has no flash target (a resource of kind {FLASH_KIND!r}, e.g. "
                                              "a [[devices.resources]] entry with plugin = \"flash\" in its exporter's "
                                              "config)")
        if not (device["host_online"] and device["present"]):
            raise conflict("offline", f"{name} is offline (host {device['host']}): it cannot be flashed now")
        fits = {f"device:{name}", f"class:{device['class']}"}
        if image["target"] not in fits and not fits & set(await self.store.known_good_targets(image["sha256"])):
            raise APIError(422, "image_not_for_device",
                           f"image {image['name']!r} is for {image['target']}, not for {name} (class "
                           f"{device['class']}); an admin can mark it known-good for {name}")
        if device["flash_op"]:
            raise self._busy(name, device["flash_op"])
        now = self.clock()
        op = {"id": OP_PREFIX + secrets.token_hex(8), "device": name, "host": device["host"], "lease_id": lease_id,
              "requester": caller, "purpose": purpose, "sha256": image["sha256"], "image_name": image["name"],
              "size": image["size"], "identifier": target["identifier"], "plugin": target["plugin"],
              "state": "queued", "phase": "queued", "done_bytes": 0, "message": "", "seconds": {}, "boot_id": None,
              "created_at": now, "started_at": None, "ended_at": None}
        try:
            await self.store.insert_flash_op(op)
        except UniqueViolation:  # another coordinator process started one a moment ago
            raise self._busy(name, "another operation") from None
        await self.store.set_image_used(image["sha256"], now)
        await self._audit(caller, purpose, name, lease_id, {"op": op["id"], "image": image["name"],
                                                            "sha256": image["sha256"], "size": image["size"]})
        self._notify(host_key(device["host"]), BOARD_KEY)  # the board shows it flashing
        return op_json(op, lease_shown=True)  # to its requester

    @staticmethod
    def _busy(name: str, op_id: str) -> APIError:
        return conflict("flash_running", f"{name} is being flashed already ({op_id}): one flash at a time "
                                         f"(follow it with 'device-loop op {op_id}', or the flash_status tool)")

    # ---- what exporters report ----------------------------------------------------------------

    async def _apply_flash_reports(self, host_name: str, previous: dict | None, report: Heartbeat,
                                   actor: str) -> None:
        """Progress and results of this host's flashes; a flash its exporter was running when it
        restarted is interrupted. Nothing is read when neither happened (no statement)."""
        reported = {f.op: f for f in report.flashes}
        restarted = previous is not None and previous["boot_id"] != report.boot_id
        if not reported and not restarted:
            return
        now = self.clock()
        for op in await self.store.flash_ops_to_update(host_name, list(reported), restarted, report.boot_id):
            if op["state"] not in LIVE_OP_STATES:
                continue  # a result reported again, before the exporter saw it acknowledged
            seen = reported.get(op["id"])
            if seen is None:  # running under an earlier boot of this exporter, which is gone
                seen = FlashReport(op=op["id"], device=op["device"], state="failed",
                                   phase=op["phase"] if op["phase"] in WRITING_PHASES else "fetching",
                                   done_bytes=op["done_bytes"], seconds=op["seconds"],
                                   changed=op["phase"] in WRITING_PHASES,
                                   message=f"interrupted: exporter {host_name} restarted during the flash")
            fields = {"state": seen.state, "phase": seen.phase, "done_bytes": seen.done_bytes,
                      "message": seen.message, "seconds": {k: round(v, 3) for k, v in seen.seconds.items()},
                      "boot_id": report.boot_id}
            if all(op[k] == v for k, v in fields.items()):
                continue
            fields["started_at"] = op["started_at"] or now
            if seen.state != "running":
                fields["ended_at"] = now
            await self.store.update_flash_op(op["id"], fields)
            if seen.state != "running":
                await self._finished({**op, **fields}, seen.changed, actor)
            self._notify(op_key(op["id"]))

    async def _finished(self, op: dict, changed: bool, actor: str) -> None:
        detail = {"op": op["id"], "image": op["image_name"], "sha256": op["sha256"], "message": op["message"]}
        await self._audit(actor, f"flash_{op['state']}", op["device"], op["lease_id"], detail)
        self._notify(BOARD_KEY)  # no longer flashing, perhaps needing recovery
        self.store.after_commit(self.metrics.flashes.labels(outcome=op["state"], purpose=op["purpose"]).inc)
        device = await self.store.device(op["device"])
        if device is None:
            return
        if op["state"] == "failed" and changed:
            what = f"{op['purpose']} {op['id']} of {op['image_name']} failed while {op['phase']}"
            await self._flag(device, f"{what}: {op['message']}", f"needs recovery: {what}", actor)
        elif op["state"] == "done" and device["needs_recovery"]:
            good = await self.store.known_good_targets(op["sha256"])
            if {f"device:{device['name']}", f"class:{device['class']}"} & set(good):
                await self._flag(device, None, f"recovered by {op['id']} (known-good {op['image_name']})", actor)

    async def _flag(self, device: dict, needs_recovery: str | None, cause: str, actor: str) -> None:
        """Set or clear ``needs_recovery``; the device's ring log says so (its state stays)."""
        now = self.clock()
        seq = await self.store.update_device_logged(device["name"], needs_recovery=needs_recovery, updated_at=now)
        await self.store.add_ring_entries([ring_entry(device, seq, device["state"], now, cause, actor)])
