"""The Python client library.

    with Lab(url).reserve("sim-board-0", ttl="10m") as lease:
        host, port = lease.endpoint("uart")
        ...

``reserve`` answers at once with a pending lease; entering the ``with`` block waits
until its endpoints are up, and leaving it releases the lease, also on exceptions.
"""
from __future__ import annotations

import time

from device_loop.core.durations import parse_duration

from .http import Coordinator, CoordinatorError

FINAL_STATES = ("released", "expired", "failed", "revoked")


class LeaseFailed(CoordinatorError):
    """The lease ended, or did not get ready in time."""


class Lab:
    def __init__(self, url: str | None = None, user: str | None = None):
        self.api = Coordinator(url, user)

    def devices(self) -> list[dict]:
        return self.api.get("/devices")

    def hosts(self) -> list[dict]:
        return self.api.get("/hosts")

    def reserve(self, device: str, ttl: str | float = "30m") -> "Lease":
        """Reserve ``device`` now (never blocks); the lease may still be pending."""
        return Lease(self.api, self.api.post("/leases", {"device": device, "ttl_s": parse_duration(ttl)}))

    def lease(self, lease_id: str) -> "Lease":
        return Lease(self.api, self.api.get(f"/leases/{lease_id}"))

    def my_leases(self) -> list["Lease"]:
        return [Lease(self.api, data) for data in self.api.get("/leases")]

    def log(self, device: str) -> list[dict]:
        return self.api.get(f"/devices/{device}/log")


class Lease:
    def __init__(self, api: Coordinator, data: dict):
        self.api = api
        self.data = data

    @property
    def id(self) -> str:
        return self.data["id"]

    @property
    def state(self) -> str:
        return self.data["state"]

    @property
    def endpoints(self) -> list[dict]:
        return self.data["endpoints"]

    def endpoint(self, kind: str) -> tuple[str, int]:
        """``(host, port)`` of the first endpoint of ``kind`` (``uart``, ``adb``...)."""
        for endpoint in self.endpoints:
            if endpoint["kind"] == kind:
                return endpoint["host"], endpoint["port"]
        raise KeyError(f"lease {self.id} has no {kind} endpoint (it has: "
                       f"{', '.join(e['kind'] for e in self.endpoints) or 'none yet'})")

    def refresh(self, wait_s: float = 0) -> "Lease":
        """Fetch the lease again; with ``wait_s``, wait that long for it to leave ``pending``."""
        params = {"wait": wait_s, "unless": "pending"} if wait_s else {}
        self.data = self.api.get(f"/leases/{self.id}", **params)
        return self

    def wait_ready(self, timeout: float = 60.0) -> "Lease":
        """Block until the endpoints are up; raise ``LeaseFailed`` if it ends or times out."""
        deadline = time.monotonic() + timeout
        while not self.data["ready"]:
            if self.state in FINAL_STATES:
                raise LeaseFailed(self.state, f"lease {self.id} is {self.state}: {self.data['reason']}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LeaseFailed("timeout", f"lease {self.id} not ready after {timeout:g}s ({self.data['reason']})")
            # Long-poll while pending; poll gently while active but not ready (device offline).
            if self.state == "pending":
                self.refresh(wait_s=min(remaining, 30.0))
            else:
                time.sleep(min(remaining, 0.5))
                self.refresh()
        return self

    def renew(self, ttl: str | float) -> "Lease":
        self.data = self.api.post(f"/leases/{self.id}/renew", {"ttl_s": parse_duration(ttl)})
        return self

    def release(self) -> "Lease":
        self.data = self.api.post(f"/leases/{self.id}/release")
        return self

    def __enter__(self) -> "Lease":
        try:
            return self.wait_ready()
        except BaseException:
            self.release()
            raise

    def __exit__(self, *exc_info) -> None:
        self.release()
