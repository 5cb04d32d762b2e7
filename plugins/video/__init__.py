"""Cameras pointed at devices' screens, served per lease as MJPEG over HTTP.

A camera is the only eye when a device's OS is dead (a fastboot menu, a kernel panic). It
is bound to the device it looks at in the exporter config: a ``[[devices.resources]]``
entry with ``plugin = "video"`` and one of

- ``source = "sim"``: a simulated camera (a moving pattern with the board's name, a frame
  counter and the time). It fails while ``STATE_DIR/video/DEVICE.fail`` exists, with that
  file's text as the reason;
- ``usb_serial = "..."``: a V4L2 USB camera, found in sysfs by its serial number (its
  ``/dev/videoN`` name changes across replugs; its serial does not); or ``usb_port =
  "1-1.3"`` for a camera without a serial number: the USB port it is plugged into;
- ``path = "/dev/v4l/by-id/..."``, ``file = "screen.mp4"`` (played in a loop) or
  ``url = "rtsp://..."``: anything OpenCV opens.

``width`` (1280), ``height`` (720), ``fps`` (15) and ``quality`` (JPEG, 80). The service of
a lease is a process (``stream.py``): ``stream.mjpg``, ``snapshot.jpg`` and a page that
shows the stream, under the endpoint's URL. This module itself never imports OpenCV: the
exporter stays small, and a crash in a codec takes only that lease's stream down.
"""
from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import importlib.util
import os
import time
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from device_loop.plugin import (ConfiguredResource, EndpointRole, Health, HostContext, LeaseRef, PluginConfig, Resource,
                                Service, ServiceError, UsbDevice, hookimpl, python_module, usb_devices)

SOURCES = ("source", "usb_serial", "usb_port", "path", "file", "url")
COMMAND = "device-loop video {lease}"
OPEN_TIMEOUT_S = 15.0  # a network stream may take a while to answer
READY, FAILED = "camera ready", "camera failed: "  # what the stream service says once it tried its source


class VideoConfig(PluginConfig):
    """A camera's entry: where its frames come from (exactly one of ``SOURCES``), and what
    the stream makes of them."""

    source: str | None = Field(default=None, description='"sim": a simulated camera')
    usb_serial: str | None = Field(default=None, min_length=1, description="a V4L2 USB camera's serial number")
    usb_port: str | None = Field(default=None, min_length=1, description="the USB port of a camera without one")
    path: str | None = Field(default=None, min_length=1, description="a device node")
    file: str | None = Field(default=None, min_length=1, description="a video file, played in a loop")
    url: str | None = Field(default=None, min_length=1, description="a stream OpenCV opens")
    width: int = Field(default=1280, ge=16, le=7680)
    height: int = Field(default=720, ge=16, le=4320)
    fps: float = Field(default=15, ge=1, le=60)
    quality: int = Field(default=80, ge=10, le=100, description="JPEG quality")

    @field_validator("source")
    @classmethod
    def _by_name(cls, value: str | None) -> str | None:
        if value is not None and value != "sim":
            raise ValueError(f"the only source by name is \"sim\", not {value!r}; use path, file or url")
        return value

    @model_validator(mode="after")
    def _one_source(self):
        self.exactly_one(*SOURCES)
        return self

    @property
    def origin(self) -> str:
        """Which of ``SOURCES`` the entry gives."""
        return next(key for key in SOURCES if getattr(self, key) is not None)

    @property
    def where(self) -> str:
        """Its value: the serial, port, node, file or URL."""
        return getattr(self, self.origin)


def fail_switch(host, device: str) -> Path:
    """The file whose presence makes a simulated camera fail."""
    return host.state_dir / "video" / f"{device}.fail"


def _usb_cameras(host) -> dict[tuple[str, str], tuple[str, UsbDevice]]:
    """("usb_serial", serial) and ("usb_port", port) -> (the camera's capture node, its
    UsbDevice), from /sys/class/video4linux."""
    found: dict[tuple[str, str], tuple[str, UsbDevice]] = {}
    by_path = {usb.path.resolve(): usb for usb in usb_devices(host.sysfs_root)}
    for entry in sorted((Path(host.sysfs_root) / "class" / "video4linux").glob("video*")):
        try:
            if (entry / "index").read_text().strip() != "0":
                continue  # a second node of the same camera (metadata), not the picture
            interface = (entry / "device").resolve()
        except OSError:
            continue
        usb = by_path.get(interface.parent)
        if usb is not None:
            if usb.serial:
                found.setdefault(("usb_serial", usb.serial), (f"/dev/{entry.name}", usb))
            found.setdefault(("usb_port", interface.parent.name), (f"/dev/{entry.name}", usb))
    return found


@hookimpl
def devloop_available(host: HostContext) -> str | None:
    if importlib.util.find_spec("cv2") is None:
        return "OpenCV is not installed (pip install opencv-python-headless)"
    return None


@hookimpl
def devloop_config_model() -> type[PluginConfig] | None:
    return VideoConfig


@hookimpl
def devloop_check_config(host: HostContext, entry: ConfiguredResource) -> str | None:
    config = entry.config
    if config.origin.startswith("usb_"):
        return f"no V4L2 camera with {config.origin} {config.where} is plugged in"
    return None


@hookimpl
def devloop_discover(host: HostContext) -> Sequence[Resource] | None:
    cameras = None
    found = []
    for entry in host.entries:
        config = entry.config
        if config.origin.startswith("usb_"):
            cameras = _usb_cameras(host) if cameras is None else cameras
            key = (config.origin, config.where)
            if key not in cameras:
                continue
            node, usb = cameras[key]
            who = usb.serial if config.origin == "usb_serial" else f"port-{config.where}"
            found.append(entry.resource("video", f"v4l2:{usb.vendor}:{usb.product}:{who}", node=node))
        else:
            found.append(entry.resource("video", f"video:{host.name}:{entry.device}"))
    return found


@hookimpl
def devloop_health(host: HostContext, resource: Resource) -> Health:
    config = resource.config
    if config.origin == "source":
        switch = fail_switch(host, resource.device)
        if switch.exists():
            return Health("failed", switch.read_text().strip() or "the simulated camera was unplugged")
    elif config.origin in ("path", "file") or resource.node:
        where = resource.node or config.where
        if not os.path.exists(where):
            return Health("failed", f"{where} does not exist" if config.origin == "file" else
                          f"{where} is gone (unplugged?)")
        if not os.access(where, os.R_OK):
            return Health("failed", f"{where} is not readable by the exporter")
    return Health("ok")


@hookimpl
def devloop_start(host: HostContext, resource: Resource, lease: LeaseRef) -> Service | None:
    health = devloop_health(host, resource)
    if health.status == "failed":
        raise ServiceError(f"the camera cannot be used: {health.reason}")
    config = resource.config
    sim = config.origin == "source"
    argv = [*python_module("device_loop.plugins.video.stream"), "--fd", "{fd}",
            "--kind", "sim" if sim else "capture", "--source", "" if sim else (resource.node or config.where),
            "--name", resource.device, "--fail-switch", str(fail_switch(host, resource.device)),
            "--width", str(config.width), "--height", str(config.height),
            "--fps", str(config.fps), "--quality", str(config.quality)]
    params = {"stream": "stream.mjpg", "snapshot": "snapshot.jpg", "width": config.width,
              "height": config.height}
    service = host.serve_on_free_port(argv, resource, lease, name="video", protocol="http", params=params,
                                      command=COMMAND, role=EndpointRole.HTTP_STREAM)
    problem = _opened(service.processes[0])
    if problem:
        service.processes[0].stop()
        raise ServiceError(problem)
    service.endpoints = [dataclasses.replace(e, url=f"http://{e.host}:{e.port}/") for e in service.endpoints]
    return service


def _opened(proc) -> str | None:
    """Wait until the stream service opened its source: None, or why it could not."""
    deadline = time.monotonic() + OPEN_TIMEOUT_S
    while time.monotonic() < deadline:
        said = proc.output()
        if READY in said:
            return None
        if FAILED in said:
            return "the camera cannot be used: " + said.split(FAILED, 1)[1].strip().splitlines()[0]
        if not proc.alive():
            return f"the stream service exited: {said.strip()[-300:]}"
        time.sleep(0.01)
    return f"the camera did not open within {OPEN_TIMEOUT_S:g}s"
