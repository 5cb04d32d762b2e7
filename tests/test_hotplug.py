"""udev wakes the exporter where libudev exists; its absence changes nothing but the wait."""
import threading

import pytest

from device_loop.core.hotplug import watch_hotplug

pytestmark = pytest.mark.timeout(10)


def test_watching_starts_here_and_discovery_never_depends_on_it():
    woken = threading.Event()
    why_not = watch_hotplug(woken.set)
    # These machines have libudev and netlink, but no udevd sending events: the watcher
    # must start, and a lack of events must leave the exporter on its heartbeat.
    assert why_not is None
    assert not woken.wait(0.2)
