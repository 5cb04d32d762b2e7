"""udev wakes the exporter where libudev exists; its absence changes nothing but the wait.

No udevd runs on the test machines, so the test plays it: in a network namespace of its
own (nothing sent there reaches another process of the machine), it broadcasts device
events on the udev netlink group the way udevd does (libudev's header, then the event's
properties), and the watcher, libudev's monitor on its own netlink socket, must wake for
a tty or USB device and for nothing else.
"""
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from device_loop.core.hotplug import watch_hotplug

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

NETLINK_KOBJECT_UEVENT = 15
UDEV_GROUP = 2  # libudev's MONITOR_GROUP_UDEV: what udevd sends once its rules ran (1 is the kernel's)
UDEV_MAGIC = 0xFEEDCAFE
WAKE_S = 10.0  # a wake that comes takes milliseconds
QUIET_S = 0.5  # an event that must not wake: only time can show that it did not


def murmur_hash2(data: bytes) -> int:
    """libudev's hash of a subsystem name (MurmurHash2, seed 0): the monitor's socket filter
    compares it, in the kernel, with the one in the header."""
    m, h = 0x5BD1E995, len(data)
    whole = len(data) // 4 * 4
    for (k,) in struct.iter_unpack("<I", data[:whole]):
        k = k * m & 0xFFFFFFFF
        k = (k ^ k >> 24) * m & 0xFFFFFFFF
        h = (h * m & 0xFFFFFFFF) ^ k
    tail = data[whole:]
    if tail:
        h = (h ^ int.from_bytes(tail, "little")) * m & 0xFFFFFFFF
    h = (h ^ h >> 13) * m & 0xFFFFFFFF
    return h ^ h >> 15


def udev_event(subsystem: str, devpath: str, seqnum: int) -> bytes:
    """An "add" event as udevd broadcasts it (systemd's device_monitor_send_device)."""
    properties = b"".join(f"{key}={value}\0".encode() for key, value in (
        ("ACTION", "add"), ("DEVPATH", devpath), ("SUBSYSTEM", subsystem), ("SEQNUM", seqnum)))
    header_size = 40
    return struct.pack("=8s4sIII4s12x", b"libudev", struct.pack(">I", UDEV_MAGIC), header_size, header_size,
                       len(properties), struct.pack(">I", murmur_hash2(subsystem.encode()))) + properties


def uevent_listeners() -> int:
    """Netlink uevent sockets of this network namespace that joined a group (any: the test
    must fail, not skip, if the watcher listened to the kernel's instead of udev's)."""
    rows = [line.split() for line in Path("/proc/self/net/netlink").read_text().splitlines()[1:]]
    return sum(int(row[1]) == NETLINK_KOBJECT_UEVENT and int(row[3], 16) != 0 for row in rows)


def play_udevd() -> dict:
    """Watch, send events as udevd would, and say what woke the watcher. Run only in a
    network namespace of its own (``test_udev_events_of_ttys_and_usb_devices_wake_the_exporter``)."""
    wakes = threading.Semaphore(0)
    why_not = watch_hotplug(wakes.release)
    if why_not:
        return {"not_watching": why_not}
    if uevent_listeners() == 0:
        # libudev joins udev's group only where udevd runs (/run/udev/control) or /dev is a devtmpfs
        return {"not_watching": "libudev does not join udev's netlink group on this machine"}
    udevd = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_KOBJECT_UEVENT)
    said = {}
    for seqnum, (subsystem, devpath, expected) in enumerate(
            [("block", "/devices/virtual/block/loop7", False), ("tty", "/devices/virtual/tty/ttyTEST0", True),
             ("usb", "/devices/pci0000:00/0000:00:14.0/usb1/1-4", True)], start=1):
        try:
            udevd.sendto(udev_event(subsystem, devpath, seqnum), (0, UDEV_GROUP))
        except ConnectionRefusedError:  # (what udevd gets from a multicast send, too)
            pass
        said[subsystem] = wakes.acquire(timeout=WAKE_S if expected else QUIET_S)
    return said


def private_network() -> list[str]:
    """The command prefix that runs a program in a network namespace of its own."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare(1): no network namespace of our own to send udev events in")
    prefix = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--net"]
    tried = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30)
    if tried.returncode != 0:
        pytest.skip(f"no network namespace of our own to send udev events in: {tried.stderr.strip()}")
    return prefix


def test_udev_events_of_ttys_and_usb_devices_wake_the_exporter():
    ran = subprocess.run([*private_network(), sys.executable, __file__], capture_output=True, text=True, timeout=50)
    assert ran.returncode == 0, ran.stderr
    said = json.loads(ran.stdout.strip().splitlines()[-1])
    if "not_watching" in said:
        pytest.skip(f"no udev events can reach libudev here: {said['not_watching']}")
    assert said == {"block": False, "tty": True, "usb": True}, \
        "a tty or USB device's event wakes the watcher, a block device's does not"


def test_without_libudev_the_watcher_says_why_and_nothing_breaks(monkeypatch):
    import pyudev._ctypeslib.utils

    monkeypatch.setattr(pyudev._ctypeslib.utils, "find_library", lambda name: None)  # a host without libudev
    woken = threading.Event()
    assert watch_hotplug(woken.set) == "ImportError: No library named udev", "the exporter logs why wake-ups are off"
    assert not woken.is_set()


if __name__ == "__main__":
    print(json.dumps(play_udevd()))
