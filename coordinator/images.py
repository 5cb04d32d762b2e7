"""The image registry (docs/architecture.md, "Image registry"): content-addressed images,
known-good marks, clean-up.

An image is for a device (``device:NAME``) or a device class (``class:NAME``); an admin
marks images known-good for either, and the latest known-good of a device (else of its
class) is what recovery flashes.
"""
from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, AsyncIterator

from device_loop.core import NAME_PATTERN
from device_loop.core.disk_images import disk_problem
from device_loop.core.durations import iso
from device_loop.core.suggestions import MAX_COMPARED, did_you_mean

from device_loop.core.answers import ImageAnswer
from device_loop.core.errors import ErrorCode
from .errors import APIError, conflict, not_found
from .image_files import ImageFiles
from .lifecycle import Lifecycle
from .rows import DeviceFacts, ImageRow, KnownGoodImage
from .store import Store, UniqueViolation
from .who import Who
from .store.devices import DeviceQueries
from .store.images import ImageQueries
from .store.operations import OperationQueries

log = logging.getLogger(__name__)

SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
DIGEST_PREFIX = "sha256:"
HEX = re.compile(r"^[0-9a-fA-F]+$")
MIN_PREFIX_DIGITS = 8  # the start of a digest names an image from this many digits on
REF_DIGITS = 12        # what listings print of a digest
FILE_PIN_S = 60.0      # an upload's pin keeps its file from the sweep this long at most
SWEEP_EVERY_S = 60.0


def image_ref(sha256: str) -> str:
    """How an image is named where it can never be confused with another: its digest's start,
    as ``sha256:`` and 12 digits (names can never look like a digest: ``check_image_name``)."""
    return f"{DIGEST_PREFIX}{sha256[:REF_DIGITS]}"


def check_image_name(name: str) -> None:
    """An image's name: the lab's name pattern, and never what a reference to a digest looks like."""
    if not re.match(NAME_PATTERN, name or ""):
        raise APIError(422, ErrorCode.INVALID, f"image name {name!r}: letters, digits, '.', '_', '-'; 64 at most")
    if len(name) >= MIN_PREFIX_DIGITS and HEX.match(name):
        raise APIError(422, ErrorCode.INVALID, f"image name {name!r} looks like a sha256 or its start "
                                               f"({MIN_PREFIX_DIGITS} or more hexadecimal digits), which name images "
                                               "by their bytes: choose a name with another character in it")


def parse_ref(ref: str) -> tuple[str, str]:
    """What an image reference means: ``("digest", hex)`` for ``sha256:`` and 64 digits (or
    64 digits alone), ``("prefix", hex)`` for ``sha256:`` and 8 digits or more (or 8 to 63
    digits alone), else ``("name", ref)``. A digest and a name are never confused: names may
    not look like a digest's start."""
    digits = ref.removeprefix(DIGEST_PREFIX)
    if ref.startswith(DIGEST_PREFIX) and not (MIN_PREFIX_DIGITS <= len(digits) <= 64 and HEX.match(digits)):
        raise APIError(422, ErrorCode.INVALID, f"{ref!r}: after {DIGEST_PREFIX!r} come {MIN_PREFIX_DIGITS} to 64 "
                                               "hexadecimal digits of the image's sha256")
    if len(digits) >= MIN_PREFIX_DIGITS and HEX.match(digits):
        return ("digest" if len(digits) == 64 else "prefix"), digits.lower()
    return "name", ref


def _listed(images: list[ImageRow]) -> str:
    return ", ".join(f"{i['name']} for {i['target']} ({image_ref(i['sha256'])})" for i in images)


def image_json(row: ImageRow, known_good_for: list[str] | None = None) -> ImageAnswer:
    """An image as listings show it, with the targets it is known-good for."""
    return {"sha256": row["sha256"], "ref": image_ref(row["sha256"]), "name": row["name"], "size": row["size"],
            "description": row["description"], "for": row["target"], "uploader": row["uploader"],
            "created_at": iso(row["created_at"]), "last_used_at": iso(row["last_used_at"]),
            "known_good_for": known_good_for or []}


class Images:
    """The registry: its rows, its files (``ImageFiles``), their references."""

    def __init__(self, life: Lifecycle, files: ImageFiles, *,
                 images_sql: ImageQueries, devices_sql: DeviceQueries, operations_sql: OperationQueries):
        self.life, self.image_files = life, files
        self.store: Store = life.store
        self.images_sql = images_sql
        self.devices_sql = devices_sql
        self.operations_sql = operations_sql
        self._next_sweep = 0.0

    async def _target(self, name: str) -> str:
        """``device:NAME`` or ``class:NAME`` for what an image is for (given as a name, or
        in that form, as listings print it)."""
        if not name:  # (as the document says of `for`: a name, not nothing)
            raise APIError(422, ErrorCode.INVALID, "for: say which device or device class the image is for")
        kind, _, bare = name.rpartition(":")
        if kind in ("", "device") and await self.devices_sql.device(bare) is not None:
            return f"device:{bare}"
        if kind in ("", "class") and bare in await self.devices_sql.device_classes():
            return f"class:{bare}"
        raise APIError(404, ErrorCode.UNKNOWN_TARGET, f"no device or device class is called {name!r}")

    async def image(self, ref: str, targets: set[str] | None = None) -> ImageRow:
        """An image by its reference (``parse_ref``): a digest, its start, or a name. A name is
        unique for one target only: of several images so called, the one for ``targets`` (the
        device being flashed and its class, the target being marked), else the reference is
        refused as ambiguous, with what it matched."""
        kind, value = parse_ref(ref)
        if kind == "digest":
            found = [image] if (image := await self.images_sql.image(value)) else []
        elif kind == "prefix":
            found = await self.images_sql.images_by_prefix(value)
        else:
            found = await self.images_sql.images_named(value)
            fitting = [i for i in found if targets and i["target"] in targets]
            found = fitting if len(fitting) == 1 else found
        if not found:
            what = ("has a sha256 starting" if kind == "prefix" else "has the sha256" if kind == "digest"
                    else "is called")
            hint = did_you_mean(value, await self.images_sql.image_names(MAX_COMPARED)) if kind == "name" else ""
            raise APIError(404, ErrorCode.UNKNOWN_IMAGE, f"no image {what} {value!r}{hint}; 'device-loop images ls' "
                                                         "lists them")
        if len(found) > 1:
            raise conflict(ErrorCode.AMBIGUOUS_IMAGE, f"{ref!r} names several images: {_listed(found)}; name one by "
                                                      f"its sha256 (as shown) instead")
        return found[0]

    async def known_good_image(self, device: DeviceFacts) -> KnownGoodImage | None:
        """The image recovery writes onto ``device`` (its name and class): the latest marked
        known-good for it, else for its class (with ``marked_at``)."""
        for target in (f"device:{device['name']}", f"class:{device['class']}"):
            image = await self.images_sql.latest_known_good(target)
            if image is not None:
                return image
        return None

    async def upload(self, chunks: AsyncIterator[bytes], name: str, target_name: str, description: str,
                     declared_sha256: str | None, declared_size: int | None, caller: str) -> tuple[ImageAnswer, bool]:
        """Store an image streamed in ``chunks``: (the image, whether it is new).

        The file is put in place under its digest only after the database pinned it, and
        never removed on an upload's behalf: the same bytes may be another upload's, in this
        process or another. Files no row uses go in ``sweep_files``."""
        check_image_name(name)
        if len(description) > 1000:
            raise APIError(422, ErrorCode.INVALID, "the description is longer than 1000 characters")
        if declared_sha256 is not None and not SHA256.match(declared_sha256):
            raise APIError(422, ErrorCode.INVALID, "sha256 must be 64 hexadecimal digits")
        target = await self._target(target_name)
        limit, too_large = await self._upload_limit(caller)
        received = await self.image_files.receive(chunks, limit, too_large, declared_sha256, declared_size)
        # an image is a whole file: one that names another (a qcow2's backing or data file) would
        # have a tool open that file of the exporter's host (docs/architecture.md, "Virtual devices")
        problem = await asyncio.to_thread(disk_problem, received.partial)
        if problem is not None:
            self.image_files.discard(received)
            raise APIError(422, ErrorCode.INVALID, f"the image is refused: {problem}")
        try:
            async with self.store.tx():
                existing = await self.images_sql.image(received.sha256)
                if existing is None:
                    self._refuse_taken_name(await self.images_sql.images_named(name), name, target)
                    await self.images_sql.pin_image_file(received.sha256, self.life.clock())
        except BaseException:
            self.image_files.discard(received)
            raise
        if existing is not None:
            self.image_files.discard(received)
            return self._uploaded_before(existing, name, target, target_name)
        self.image_files.place(received)
        now = self.life.clock()
        row: ImageRow = {"sha256": received.sha256, "name": name, "size": received.size, "description": description,
               "target": target, "uploader": caller, "created_at": now, "last_used_at": now}
        try:
            async with self.store.tx():
                # pinned again, and there: a sweep that found the pin stale took the file, or waits
                await self.images_sql.pin_image_file(received.sha256, now)
                if not self.image_files.path(received.sha256).exists():
                    raise APIError(503, ErrorCode.TRY_AGAIN, "the registry was cleaning up these bytes just now: "
                                                             "upload them again")
                await self.images_sql.insert_image(row)
                quota = self.life.settings.image_quota_bytes
                if not await self.images_sql.count_image_bytes(caller, received.size, quota):
                    raise APIError(413, ErrorCode.OVER_QUOTA, await self._over_quota(caller, received.size))
                await self.life.audit(caller, "image_upload", None, None,
                                  {"image": name, "for": target, "sha256": received.sha256, "size": received.size})
        except UniqueViolation:  # these bytes, or this name for this target, were just registered
            existing = await self.images_sql.image(received.sha256)
            if existing is not None:
                return self._uploaded_before(existing, name, target, target_name)
            self._refuse_taken_name(await self.images_sql.images_named(name), name, target)
            raise
        return image_json(row), True

    @staticmethod
    def _refuse_taken_name(named: list[ImageRow], name: str, target: str) -> None:
        for image in named:
            if image["target"] == target:
                raise conflict(ErrorCode.NAME_TAKEN, f"another image for {target} is called {name!r} "
                                                     f"({image_ref(image['sha256'])}); choose another name")

    async def _upload_limit(self, caller: str) -> tuple[int, APIError]:
        """How many bytes ``caller``'s upload may bring, and the refusal past them (the quota
        is checked again when the image is counted: others may be uploading meanwhile)."""
        limit = self.life.settings.max_image_bytes
        quota = self.life.settings.image_quota_bytes
        if quota:
            room = max(0, quota - (await self.images_sql.user_counts(caller))["image_bytes"])
            if room < limit:
                return room, APIError(413, ErrorCode.OVER_QUOTA, await self._over_quota(caller, room + 1))
        return limit, APIError(413, ErrorCode.TOO_LARGE, f"the image is over this lab's limit of {limit} bytes")

    async def _over_quota(self, caller: str, size: int) -> str:
        used = (await self.images_sql.user_counts(caller))["image_bytes"]
        quota = self.life.settings.image_quota_bytes
        return (f"{size} more bytes would take {caller} over this lab's quota of {quota} "
                f"bytes of images per person ({used} used): remove some first (device-loop images rm)")

    @staticmethod
    def _uploaded_before(existing: ImageRow, name: str, target: str, target_name: str) -> tuple[ImageAnswer, bool]:
        if (existing["name"], existing["target"]) == (name, target):
            return image_json(existing), False
        raise conflict(ErrorCode.IMAGE_EXISTS, f"these bytes are image {existing['name']!r} already (for "
                                               f"{existing['target']}, {image_ref(existing['sha256'])}); to flash them "
                                               f"onto {target_name} too, an admin marks that image known-good for it")

    async def sweep_files(self) -> list[str]:
        """Remove the registry's files that no image uses (and no upload pinned lately), and
        what killed uploads left; the digests removed. Each file goes inside the transaction
        that deletes its row, so a new upload of the same bytes (which pins the row first)
        either waits for it or keeps the file."""
        self._next_sweep = self.life.clock() + SWEEP_EVERY_S
        if self.image_files.folder is None:
            return []
        await asyncio.to_thread(self.image_files.sweep_partials)
        on_disk = await asyncio.to_thread(self.image_files.digests)
        async with self.store.tx():
            now = self.life.clock()
            await self.images_sql.adopt_image_files(sorted(on_disk - await self.images_sql.image_file_names()), now)
            unused = await self.images_sql.unused_image_files(now - FILE_PIN_S)
            for sha256 in unused:
                self.image_files.remove(sha256)
        return unused

    async def sweep_files_if_due(self) -> None:
        if self.life.clock() >= self._next_sweep:
            await self.sweep_files()

    def _sweep_after_commit(self) -> None:
        """Sweep once the current transaction committed (a file goes only after its row did)."""
        def start() -> None:
            task = asyncio.get_running_loop().create_task(self.sweep_files())
            task.add_done_callback(_log_failure)
        self.store.after_commit(start)

    async def list_images(self, device: str | None = None) -> list[ImageAnswer]:
        """Every image, or those for ``device`` and its class."""
        targets = None
        if device is not None:
            row = await self.devices_sql.device(device)
            if row is None:
                raise not_found("device", device)
            targets = [f"device:{device}", f"class:{row['class']}"]
        return [image_json(r, r["known_good_for"]) for r in await self.images_sql.images(targets)]

    async def image_info(self, ref: str) -> ImageAnswer:
        image = await self.image(ref)
        return next(i for i in await self.list_images() if i["sha256"] == image["sha256"])

    async def mark_good(self, ref: str, target_name: str, admin: str) -> ImageAnswer:
        async with self.store.tx():
            target = await self._target(target_name)
            image = await self.image(ref, {target})
            await self.images_sql.mark_known_good({"target": target, "sha256": image["sha256"], "marked_by": admin,
                                                   "at": self.life.clock()})
            await self.life.audit(admin, "image_known_good", None, None, {"image": image["name"], "for": target})
        return await self.image_info(image["sha256"])

    async def remove_image(self, ref: str, who: Who) -> dict[str, Any]:
        """Remove an image, if ``who`` may act on its uploader (docs/architecture.md, "Who may
        act on what")."""
        caller = who.name
        async with self.store.tx():
            image = await self.image(ref)
            if not who.may_act_on(image["uploader"]):
                raise APIError(403, ErrorCode.FORBIDDEN, f"image {image['name']!r} is {image['uploader']}'s: "
                                                         "only they or an admin remove it")
            sole = await self.images_sql.sole_known_good_targets(image["sha256"])
            if sole:
                raise conflict(ErrorCode.ONLY_KNOWN_GOOD, f"image {image['name']!r} is the only known-good image for "
                                                          f"{', '.join(sole)}: mark another one first")
            using = await self.operations_sql.live_image_uses(image["sha256"])
            if using:
                raise conflict(ErrorCode.IMAGE_IN_USE, f"image {image['name']!r} is being flashed onto "
                                                       f"{using[0]['device']} ({using[0]['id']}): remove it once that "
                                                       f"ends")
            await self._delete(image)
            await self.life.audit(caller, "image_remove", None, None, {"image": image["name"], "for": image["target"],
                                                                   "sha256": image["sha256"]})
        return {"sha256": image["sha256"], "name": image["name"], "removed": True}

    async def collect_images(self, unused_days: float, admin: str) -> dict[str, Any]:
        """Remove the images that are not known-good and that nothing used for ``unused_days``."""
        if not unused_days >= 0:
            raise APIError(422, ErrorCode.INVALID, "days must be 0 or more")
        async with self.store.tx():
            gone = await self.images_sql.images_unused_since(self.life.clock() - unused_days * 86400)
            for image in gone:
                await self._delete(image)
            names = [i["name"] for i in gone]
            await self.life.audit(admin, "image_gc", None, None, {"removed": [_listed([i]) for i in gone],
                                                              "unused_days": unused_days})
        return {"removed": names, "refs": [image_ref(i["sha256"]) for i in gone]}

    async def _delete(self, image: ImageRow) -> None:
        """An image's row goes (its known-good marks with it), and its bytes from its uploader's
        count; its file once the transaction committed (``sweep_files``)."""
        await self.images_sql.delete_image(image["sha256"])
        await self.images_sql.uncount_image_bytes(image["uploader"], image["size"])
        self._sweep_after_commit()


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("sweeping the image registry's files failed: %r; the next sweep tries again", task.exception())
