"""Camera pointed at a device's screen, served as MJPEG (not yet: no issue filed)."""
from device_loop.plugin import hookimpl


@hookimpl
def devloop_available(host):
    return "not yet: the camera plugin has not been built"
