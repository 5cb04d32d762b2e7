"""Hot-plug wake-ups (docs/architecture.md, "Discovery"): a udev event only wakes the
exporter early, so a phone plugged in shows up at once instead of at the next heartbeat.
What is there is still decided by the sysfs scan alone; without libudev nothing but the
wait changes."""
from __future__ import annotations

from collections.abc import Callable

SUBSYSTEMS = ("tty", "usb")


def watch_hotplug(wake: Callable[[], None]) -> str | None:
    """Call ``wake()`` on every tty or USB udev event, from a daemon thread.

    Returns None when watching (from then on: an event that comes after the return wakes),
    or why it cannot (no libudev, no netlink here).
    """
    try:
        import pyudev

        monitor = pyudev.Monitor.from_netlink(pyudev.Context())
        for subsystem in SUBSYSTEMS:
            monitor.filter_by(subsystem)
        # bound and subscribed here, not in the observer's thread: nothing sent after the
        # return is missed, and a failure to bind is the answer rather than a dead thread
        monitor.start()
        observer = pyudev.MonitorObserver(monitor, callback=lambda device: wake(), name="hotplug")
        observer.daemon = True
        observer.start()
    except Exception as exc:  # ImportError for a missing libudev, OSError for netlink
        return f"{type(exc).__name__}: {exc}"
    return None
