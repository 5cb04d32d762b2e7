"""UART consoles served by ser2net (issue #3: not yet)."""
from device_loop.core.hookspecs import hookimpl


@hookimpl
def devloop_available(host):
    return "not yet: the UART plugin lands with issue #3"
