"""Driving real coordinator processes from a test: an exporter that speaks the heartbeat
protocol over HTTP to any of them (and keeps what it sent, to send it again late or
twice), clients spread over the processes, and direct reads of their PostgreSQL."""
from __future__ import annotations

import asyncio
import threading

import httpx2

from device_loop.core import LIVE_LEASE_STATES
from device_loop.core.protocol import EndpointReport, ServiceReport
from lab_in_process import FakeExporter, device

LIVE = LIVE_LEASE_STATES
FINAL = ("released", "expired", "failed", "revoked")
END_ACTIONS = ("release", "expire", "fail", "revoke")  # the audit's action for each way a lease ends


class Spread:
    """One HTTP client per coordinator process; each request names the process it goes to."""

    def __init__(self, coordinators, timeout: float = 30.0):
        self.clients = [httpx2.Client(base_url=f"{c.url}/api/v1", timeout=timeout) for c in coordinators]

    def request(self, via: int, method: str, path: str, user: str = "alice", **kwargs) -> httpx2.Response:
        headers = {"X-Device-Loop-User": user, **kwargs.pop("headers", {})}
        return self.clients[via % len(self.clients)].request(method, path, headers=headers, **kwargs)

    def at_once(self, *calls) -> list:
        """Run each ``(function, args...)`` in a thread of its own, released together; their results."""
        barrier, results = threading.Barrier(len(calls)), [None] * len(calls)

        def run(n, function, *args):
            barrier.wait(10)
            results[n] = function(*args)

        threads = [threading.Thread(target=run, args=(n, *call)) for n, call in enumerate(calls)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(t.is_alive() for t in threads), "a request did not come back within 60 s"
        return results

    def close(self) -> None:
        for client in self.clients:
            client.close()


def service(lease: str, device_name: str, identifier: str, port: int) -> dict:
    """A service up for ``lease`` with one endpoint on ``port``, as an exporter reports it."""
    return ServiceReport(lease=lease, device=device_name, identifier=identifier, kind="uart",
                         endpoints=[EndpointReport(kind="uart", host="127.0.0.1", port=port)]
                         ).model_dump(exclude_none=True)


class LiveExporter(FakeExporter):
    """A host's exporter talking to real coordinator processes. Every report this boot
    sent is kept in ``sent`` (in generation order), to be sent again out of order."""

    HEARTBEAT_S = 5.0  # reported period: the host counts as silent after 15 s without a report

    def __init__(self, spread: Spread, name: str):
        super().__init__(None, name)
        self.spread = spread
        self.sent: list[dict] = []

    def reboot(self) -> None:
        super().reboot()
        self.sent = []

    def body(self, devices: list[str], services=(), stopping: bool = False) -> dict:
        """The next report of this boot (a new generation): ``devices`` by name, present."""
        applied = sorted({s["lease"] for s in services})
        body = self.report([device(d) for d in devices], list(services), applied, heartbeat_s=self.HEARTBEAT_S,
                           stopping=stopping)
        self.sent.append(body)
        return body

    def post(self, via: int, body: dict) -> httpx2.Response:
        return self.spread.request(via, "POST", f"/hosts/{self.name}/heartbeat", json=body)

    def beat(self, via: int, devices: list[str], services=(), stopping: bool = False) -> httpx2.Response:
        """Send the next report through process ``via``; it must be taken."""
        response = self.post(via, self.body(devices, services, stopping))
        assert response.status_code == 200, response.text
        return response

    def desired(self, via: int) -> dict:
        response = self.spread.request(via, "GET", f"/hosts/{self.name}/desired")
        assert response.status_code == 200, response.text
        return response.json()


class LabDatabase:
    """Direct reads of the coordinators' PostgreSQL database (asyncpg, on an event loop of
    its own, so that synchronous tests can use it)."""

    def __init__(self, url: str):
        import asyncpg

        self.loop = asyncio.new_event_loop()
        self.connection = self.loop.run_until_complete(asyncpg.connect(url))

    def rows(self, sql: str, *args) -> list[dict]:
        return [dict(r) for r in self.loop.run_until_complete(self.connection.fetch(sql, *args))]

    def snapshot(self, host: str, devices: list[str]) -> dict:
        """Everything a report from ``host`` could change, read in one consistent snapshot."""
        async def read():
            async with self.connection.transaction(isolation="repeatable_read", readonly=True):
                out = {}
                for key, sql, arg in (
                        ("host", "SELECT * FROM hosts WHERE name = $1", host),
                        ("devices", "SELECT * FROM devices WHERE name = ANY($1::text[]) ORDER BY name", devices),
                        ("leases", "SELECT * FROM leases WHERE device = ANY($1::text[]) ORDER BY id", devices),
                        ("ring", "SELECT * FROM device_ring WHERE device = ANY($1::text[]) ORDER BY device, seq",
                         devices),
                        ("resources", "SELECT * FROM resources WHERE device = ANY($1::text[]) ORDER BY identifier",
                         devices),
                        ("audit", "SELECT * FROM audit WHERE device = ANY($1::text[]) ORDER BY id", devices)):
                    out[key] = [dict(r) for r in await self.connection.fetch(sql, arg)]
                return out
        return self.loop.run_until_complete(read())

    def close(self) -> None:
        self.loop.run_until_complete(self.connection.close())
        self.loop.close()
