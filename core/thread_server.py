"""A service run as a thread of the exporter instead of a process of its own.

For what costs next to nothing to serve (the simulated boards' consoles, which live in
the exporter anyway): no interpreter to start, so a lease is served in microseconds, and
the service ends with the exporter. It stands in ``Service.processes`` like a process:
``alive()``, ``stop()``, ``pid`` (the exporter's own, which no orphan check counts).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Callable

log = logging.getLogger(__name__)


class ThreadServer:
    def __init__(self, name: str, serve: Callable[[socket.socket, int], None], listener: socket.socket):
        """Run ``serve(listener, stop_fd)`` in a thread; it must return once ``stop_fd`` is readable."""
        self.name, self.pid = name, os.getpid()
        self._listener = listener
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, args=(serve,), name=name, daemon=True)
        self._thread.start()

    def _run(self, serve: Callable[[socket.socket, int], None]) -> None:
        try:
            serve(self._listener, self._stop_r)
        except Exception:
            log.exception("%s failed", self.name)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, grace: float = 3.0) -> None:
        """Tell the thread to end and wait for it; its port is free once this returns."""
        os.write(self._stop_w, b"x")
        self._thread.join(grace)
        if self._thread.is_alive():
            raise RuntimeError(f"{self.name} did not end within {grace:g}s")
        self._listener.close()
        os.close(self._stop_r)
        os.close(self._stop_w)
