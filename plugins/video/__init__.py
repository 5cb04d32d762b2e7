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

import dataclasses
import importlib.util
import os
import time
from pathlib import Path

from device_loop.plugin import Health, ServiceError, hookimpl, python_module, usb_devices

SOURCES = ("source", "usb_serial", "usb_port", "path", "file", "url")
DEFAULTS = {"width": 1280, "height": 720, "fps": 15, "quality": 80}
LIMITS = {"width": (16, 7680), "height": (16, 4320), "fps": (1, 60), "quality": (10, 100)}
KEYS = (*SOURCES, *DEFAULTS)
COMMAND = "device-loop video {lease}"
OPEN_TIMEOUT_S = 15.0  # a network stream may take a while to answer
READY, FAILED = "camera ready", "camera failed: "  # what the stream service says once it tried its source


def _settings(config: dict) -> dict:
    """The entry's settings with defaults; ValueError says what is wrong."""
    given = [key for key in SOURCES if key in config]
    if len(given) != 1:
        raise ValueError(f"give exactly one of {', '.join(SOURCES)} (found: {', '.join(given) or 'none'})")
    if "source" in config and config["source"] != "sim":
        raise ValueError(f"source = {config['source']!r}: the only source by name is \"sim\"; use path, file or url")
    out = {"from": given[0], "where": str(config[given[0]])}
    for key, default in DEFAULTS.items():
        value = config.get(key, default)
        low, high = LIMITS[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
            raise ValueError(f"{key} must be a number from {low} to {high}, not {value!r}")
        out[key] = value
    return out


def fail_switch(host, device: str) -> Path:
    """The file whose presence makes a simulated camera fail."""
    return host.state_dir / "video" / f"{device}.fail"


def _usb_cameras(host) -> dict[tuple[str, str], tuple[str, object]]:
    """("usb_serial", serial) and ("usb_port", port) -> (the camera's capture node, its
    UsbDevice), from /sys/class/video4linux."""
    found = {}
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
def devloop_available(host):
    if importlib.util.find_spec("cv2") is None:
        return "OpenCV is not installed (pip install opencv-python-headless)"
    return None


@hookimpl
def devloop_check_config(host, entry):
    problem = entry.problem(KEYS, _settings)
    if problem:
        return problem
    settings = _settings(entry.settings)
    if settings["from"].startswith("usb_"):
        return f"no V4L2 camera with {settings['from']} {settings['where']} is plugged in"
    return None


@hookimpl
def devloop_discover(host):
    cameras = None
    found = []
    for entry, settings in host.usable("video", KEYS, _settings):
        if settings["from"].startswith("usb_"):
            cameras = _usb_cameras(host) if cameras is None else cameras
            key = (settings["from"], settings["where"])
            if key not in cameras:
                continue
            node, usb = cameras[key]
            who = usb.serial if settings["from"] == "usb_serial" else f"port-{settings['where']}"
            found.append(entry.resource("video", f"v4l2:{usb.vendor}:{usb.product}:{who}", node=node))
        else:
            found.append(entry.resource("video", f"video:{host.name}:{entry.device}"))
    return found


@hookimpl
def devloop_health(host, resource):
    settings = _settings(resource.config)
    if settings["from"] == "source":
        switch = fail_switch(host, resource.device)
        if switch.exists():
            return Health("failed", switch.read_text().strip() or "the simulated camera was unplugged")
    elif settings["from"] in ("path", "file") or resource.node:
        where = resource.node or settings["where"]
        if not os.path.exists(where):
            return Health("failed", f"{where} does not exist" if settings["from"] == "file" else
                          f"{where} is gone (unplugged?)")
        if not os.access(where, os.R_OK):
            return Health("failed", f"{where} is not readable by the exporter")
    return Health("ok")


@hookimpl
def devloop_start(host, resource, lease):
    health = devloop_health(host, resource)
    if health.status == "failed":
        raise ServiceError(f"the camera cannot be used: {health.reason}")
    settings = _settings(resource.config)
    sim = settings["from"] == "source"
    argv = [*python_module("device_loop.plugins.video.stream"), "--fd", "{fd}",
            "--kind", "sim" if sim else "capture", "--source", "" if sim else (resource.node or settings["where"]),
            "--name", resource.device, "--fail-switch", str(fail_switch(host, resource.device)),
            "--width", str(settings["width"]), "--height", str(settings["height"]),
            "--fps", str(settings["fps"]), "--quality", str(settings["quality"])]
    params = {"stream": "stream.mjpg", "snapshot": "snapshot.jpg", "width": settings["width"],
              "height": settings["height"]}
    service = host.serve_on_free_port(argv, resource, lease, name="video", protocol="http", params=params,
                                      command=COMMAND)
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
