"""``device-loop images``: the image registry (upload, list, mark known-good, remove, clean up)."""
from __future__ import annotations

from pathlib import Path

import click

from device_loop.core.files import file_sha256

from .commands import json_option, lab_command
from device_loop.client.lab import Lab
from .output import emit, on_terminal, progress_bar, table

CHUNK = 1 << 20


def _chunks(path: Path, show_progress: bool):
    """The file in pieces of 1 MiB; a progress bar on the terminal's stderr if asked."""
    total, sent = path.stat().st_size, 0
    with open(path, "rb") as image:
        while chunk := image.read(CHUNK):
            sent += len(chunk)
            if show_progress:
                progress_bar("uploading", sent, total, end=sent == total)
            yield chunk


def _image_text(image: dict) -> str:
    good = ", ".join(image["known_good_for"]) or "-"
    return (f"{image['name']}  sha256:{image['sha256']}\n  {image['size']} bytes, for {image['for']}, "
            f"by {image['uploader']} at {image['created_at']}; known-good for: {good}")


@click.group("images")
def images_group():
    """The image registry: what can be flashed, and what is known to be good."""


@images_group.command("upload")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", help="the image's name (letters, digits, . _ -)  [default: the file's name]")
@click.option("--for", "target", required=True, metavar="DEVICE|CLASS", help="the device or device class it is for")
@click.option("--description", default="", help="what it is (a build, a version)")
@json_option
@lab_command
def upload_command(lab: Lab, file: Path, name: str | None, target: str, description: str, as_json: bool):
    """Upload FILE (streamed; its sha256 and size are checked on arrival)."""
    params = {"name": name or file.name, "for": target, "description": description, "sha256": file_sha256(file),
              "size": file.stat().st_size}
    emit(as_json, lab.api.upload("/images", params, _chunks(file, on_terminal(as_json))), _image_text)


@images_group.command("ls")
@click.option("--device", help="only the images for this device and its class")
@json_option
@lab_command
def ls_command(lab: Lab, device: str | None, as_json: bool):
    """List the images: name, size, what they are for, known-good marks."""
    params = {"device": device} if device else {}
    emit(as_json, lab.api.get("/images", **params), lambda images: table(
        ["NAME", "REF", "SIZE", "FOR", "KNOWN-GOOD FOR", "UPLOADER"],
        [[i["name"], i["ref"], i["size"], i["for"], ",".join(i["known_good_for"]) or "-", i["uploader"]]
         for i in images]) if images else "no images yet")


@images_group.command("mark-good")
@click.argument("image", metavar="IMAGE")
@click.option("--for", "target", required=True, metavar="DEVICE|CLASS")
@json_option
@lab_command
def mark_good_command(lab: Lab, image: str, target: str, as_json: bool):
    """Mark IMAGE (its REF, sha256:..., or its name) known-good for a device or a class (admins)."""
    emit(as_json, lab.api.post(f"/admin/images/{image}/known-good", {"for": target}), _image_text)


@images_group.command("rm")
@click.argument("image", metavar="IMAGE")
@json_option
@lab_command
def rm_command(lab: Lab, image: str, as_json: bool):
    """Remove IMAGE (its REF, sha256:..., or its name; yours, or any as an admin); the only known-good
    image of a device stays."""
    emit(as_json, lab.api.post(f"/images/{image}/remove"), lambda r: f"{r['name']} removed")


@images_group.command("gc")
@click.option("--days", default=30.0, show_default=True, help="remove images nothing used for this long")
@json_option
@lab_command
def gc_command(lab: Lab, days: float, as_json: bool):
    """Remove images that are not known-good and that nothing used for DAYS (admins)."""
    emit(as_json, lab.api.post("/admin/images/gc", {"unused_days": days}),
         lambda r: "removed: " + (", ".join(f"{n} ({ref})" for n, ref in zip(r["removed"], r["refs"])) or "nothing"))
