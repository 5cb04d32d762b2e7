"""The image registry (DESIGN §6): content-addressed images, known-good marks, clean-up.

An image is for a device (``device:NAME``) or a device class (``class:NAME``); an admin
marks images known-good for either, and the latest known-good of a device (else of its
class) is what recovery flashes.
"""
from __future__ import annotations

import re
from typing import AsyncIterator

from device_loop.core import NAME_PATTERN
from device_loop.core.durations import iso

from .errors import APIError, conflict, not_found
from .lifecycle import Lifecycle
from .store import UniqueViolation

SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
SHA256_PREFIX = re.compile(r"^[0-9a-fA-F]{8,63}$")


def image_json(row: dict) -> dict:
    return {"sha256": row["sha256"], "name": row["name"], "size": row["size"], "description": row["description"],
            "for": row["target"], "uploader": row["uploader"], "created_at": iso(row["created_at"]),
            "last_used_at": iso(row["last_used_at"]), "known_good_for": row.get("known_good_for", [])}


class Images(Lifecycle):
    async def _target(self, name: str) -> str:
        """``device:NAME`` or ``class:NAME`` for what an image is for (given as a name, or
        in that form, as listings print it)."""
        kind, _, bare = name.rpartition(":")
        if kind in ("", "device") and await self.store.device(bare) is not None:
            return f"device:{bare}"
        if kind in ("", "class") and bare in await self.store.device_classes():
            return f"class:{bare}"
        raise APIError(422, "unknown_target", f"no device or device class is called {name!r}")

    async def _image(self, ref: str) -> dict:
        """An image by its name, its sha256, or the start of it (8 digits or more, as
        listings print 12)."""
        image = await self.store.image(ref)
        if image is None and SHA256_PREFIX.match(ref):
            found = await self.store.images_by_prefix(ref.lower())
            if len(found) > 1:
                raise APIError(422, "ambiguous_image", f"{ref!r} starts the sha256 of several images: "
                                                       f"{', '.join(i['name'] for i in found)}; give more digits")
            image = found[0] if found else None
        if image is None:
            raise not_found("image", ref)
        return image

    async def known_good_image(self, device: dict) -> dict | None:
        """The image recovery writes onto ``device`` (its name and class): the latest marked
        known-good for it, else for its class (with ``marked_at``)."""
        for target in (f"device:{device['name']}", f"class:{device['class']}"):
            image = await self.store.latest_known_good(target)
            if image is not None:
                return image
        return None

    async def upload(self, chunks: AsyncIterator[bytes], name: str, target_name: str, description: str,
                     declared_sha256: str | None, declared_size: int | None, caller: str) -> tuple[dict, bool]:
        """Store an image streamed in ``chunks``: (the image, whether it is new)."""
        if not re.match(NAME_PATTERN, name or ""):
            raise APIError(422, "invalid", f"image name {name!r}: letters, digits, '.', '_', '-'; 64 at most")
        if len(description) > 1000:
            raise APIError(422, "invalid", "the description is longer than 1000 characters")
        if declared_sha256 is not None and not SHA256.match(declared_sha256):
            raise APIError(422, "invalid", "sha256 must be 64 hexadecimal digits")
        target = await self._target(target_name)
        sha256, size, new_file = await self.image_files.receive(chunks, self.settings.max_image_bytes,
                                                                declared_sha256, declared_size)
        try:
            async with self.store.tx():
                existing = await self.store.image(sha256)
                if existing is not None:
                    if existing["name"] != name:
                        raise conflict("image_exists", f"these bytes are image {existing['name']!r} already (for "
                                                       f"{existing['target']}); to flash them onto {target_name} "
                                                       f"too, an admin marks that image known-good for it")
                    return image_json(existing), False
                now = self.clock()
                row = {"sha256": sha256, "name": name, "size": size, "description": description, "target": target,
                       "uploader": caller, "created_at": now, "last_used_at": now}
                try:
                    await self.store.insert_image(row)
                except UniqueViolation:
                    raise conflict("name_taken", f"another image is called {name!r}; choose another name") from None
                await self._audit(caller, "image_upload", None, None, {"image": name, "sha256": sha256, "size": size})
        except APIError:
            if new_file:
                self.image_files.remove(sha256)
            raise
        return image_json(row), True

    async def list_images(self, device: str | None = None) -> list[dict]:
        """Every image, or those for ``device`` and its class."""
        targets = None
        if device is not None:
            row = await self.store.device(device)
            if row is None:
                raise not_found("device", device)
            targets = [f"device:{device}", f"class:{row['class']}"]
        return [image_json(r) for r in await self.store.images(targets)]

    async def image_info(self, ref: str) -> dict:
        image = await self._image(ref)
        return next(i for i in await self.list_images() if i["sha256"] == image["sha256"])

    async def mark_good(self, ref: str, target_name: str, admin: str) -> dict:
        async with self.store.tx():
            image = await self._image(ref)
            target = await self._target(target_name)
            await self.store.mark_known_good({"target": target, "sha256": image["sha256"], "marked_by": admin,
                                              "at": self.clock()})
            await self._audit(admin, "image_known_good", None, None, {"image": image["name"], "for": target})
        return await self.image_info(image["sha256"])

    async def remove_image(self, ref: str, caller: str, admin: bool) -> dict:
        async with self.store.tx():
            image = await self._image(ref)
            if image["uploader"] != caller and not admin:
                raise APIError(403, "forbidden", f"image {image['name']!r} is {image['uploader']}'s: "
                                                 "only they or an admin remove it")
            sole = await self.store.sole_known_good_targets(image["sha256"])
            if sole:
                raise conflict("only_known_good", f"image {image['name']!r} is the only known-good image for "
                                                  f"{', '.join(sole)}: mark another one first")
            using = await self.store.live_flash_uses(image["sha256"])
            if using:
                raise conflict("image_in_use", f"image {image['name']!r} is being flashed onto {using[0]['device']} "
                                               f"({using[0]['id']}): remove it once that ends")
            await self.store.delete_image(image["sha256"])
            await self._audit(caller, "image_remove", None, None, {"image": image["name"], "sha256": image["sha256"]})
            self.store.after_commit(lambda: self.image_files.remove(image["sha256"]))
        return {"sha256": image["sha256"], "name": image["name"], "removed": True}

    async def collect_images(self, unused_days: float, admin: str) -> dict:
        """Remove the images that are not known-good and that nothing used for ``unused_days``."""
        if not unused_days >= 0:
            raise APIError(422, "invalid", "days must be 0 or more")
        async with self.store.tx():
            gone = await self.store.images_unused_since(self.clock() - unused_days * 86400)
            for image in gone:
                await self.store.delete_image(image["sha256"])
            names = [i["name"] for i in gone]
            await self._audit(admin, "image_gc", None, None, {"removed": names, "unused_days": unused_days})
            self.store.after_commit(lambda: [self.image_files.remove(i["sha256"]) for i in gone])
        return {"removed": names}
