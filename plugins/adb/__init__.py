"""Android Debug Bridge, one adb server per leased phone (issue #3: not yet)."""
from device_loop.core.hookspecs import hookimpl


@hookimpl
def devloop_available(host):
    return "not yet: the ADB plugin lands with issue #3"
