"""``device-loop video``: a leased device's camera, as a URL to open or a snapshot to save."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any
import sys
from pathlib import Path

import click
import httpx2

from device_loop.core.usage import camera_urls, out_of_scope

from .commands import _my_lease, json_option, lab_command
from device_loop.client.http import CoordinatorError
from device_loop.client.lab import Lab, require_ready
from device_loop.core.errors import ErrorCode
from .output import emit


def _camera(lease: Mapping[str, Any]) -> dict:
    """The URLs of a ready lease's camera (they carry the lease's capability in a lab with
    tokens: only its holder has them)."""
    require_ready(lease)
    urls = camera_urls(lease)
    if urls is None and (withheld := out_of_scope(lease, "camera", "camera")):
        raise CoordinatorError(ErrorCode.OUT_OF_SCOPE, withheld)
    if urls is None:
        kinds = ", ".join(sorted({e["kind"] for e in lease["endpoints"]})) or "none"
        raise CoordinatorError(ErrorCode.NO_CAMERA, f"{lease['device']} has no camera (kinds: {kinds})")
    return urls


@click.command("video")
@click.argument("target", metavar="DEVICE|LEASE")
@click.option("--snapshot", "snapshot", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
              help="save the current frame as this JPEG file instead (- for standard output)")
@json_option
@lab_command
def video_command(lab: Lab, target: str, snapshot: Path | None, as_json: bool):
    """The camera of a device you hold: its stream's URL (a browser shows it), or a snapshot."""
    urls = _camera(_my_lease(lab, target).data)
    if snapshot is None:
        emit(as_json, urls, lambda u: f"{u['stream']}\n  a page that shows it: {u['page']}")
        return
    try:
        answer = httpx2.get(urls["snapshot"], timeout=15, verify=False)
    except httpx2.HTTPError as exc:
        raise CoordinatorError(ErrorCode.CAMERA_UNREACHABLE, f"cannot reach the camera: {exc}") from None
    if answer.status_code != 200:
        raise CoordinatorError(ErrorCode.CAMERA_FAILED, f"the camera answered {answer.status_code}: "
                                                        f"{answer.text.strip()}")
    if str(snapshot) == "-":
        sys.stdout.buffer.write(answer.content)
        return
    try:
        snapshot.write_bytes(answer.content)
    except OSError as exc:
        raise CoordinatorError(ErrorCode.CANNOT_WRITE, f"cannot write {snapshot}: {exc.strerror}") from None
    emit(as_json, {"snapshot": str(snapshot), "bytes": len(answer.content)},
         lambda s: f"{s['snapshot']}: {s['bytes']} bytes of JPEG")
