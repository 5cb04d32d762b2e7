"""A device's screen over VNC with a web viewer (not yet: no issue filed)."""
from device_loop.plugin import hookimpl


@hookimpl
def devloop_available(host):
    return "not yet: the VNC plugin has not been built"
