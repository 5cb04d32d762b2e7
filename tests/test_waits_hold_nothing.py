"""Nothing that waits holds the lab (docs/architecture.md, "Nothing that waits holds the
lab"): while any call that waits is waiting (a long-poll, a command on a device), with an
Idempotency-Key where the call takes one, a reserve, a release and a heartbeat each
complete without waiting for it, and the waiting call holds no transaction: on SQLite the
writer's lock is free, on PostgreSQL no session of the lab is inside a transaction.

Each call of the calls table that takes a wait (``wait_s`` or ``timeout_s``) is walked; a
new one fails ``test_every_call_that_waits_is_walked`` until it is added to ``WAITERS``.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from device_loop.coordinator.calls import CALLS
from device_loop.core.protocol import EndpointReport, OperationKindReport, ServiceReport
from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

WAIT_S = 30     # how long the waiting call would wait: far longer than anything below takes
QUICK_S = 5.0   # what a reserve, a release or a heartbeat may take meanwhile (they take milliseconds)
KEYED = {c.name for c in CALLS if c.idempotent}


class Silent:
    """A peer that never answers: a board's console (``prompt``: shown when poked, then
    nothing, so a command sent to it runs until its deadline) or a camera's web server (no
    prompt: it takes a request and never answers it). ``reached`` is set once something was
    typed to the console, or a request connected to the camera."""

    def __init__(self, prompt: bytes | None = None):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.prompt = prompt
        self.reached = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                self.conns.append(conn)
                if self.prompt is None:
                    self.reached.set()
                else:
                    threading.Thread(target=self._talk, args=(conn, self.prompt), daemon=True).start()

    def _talk(self, conn: socket.socket, prompt: bytes) -> None:
        with contextlib.suppress(OSError):
            while conn.recv(4096):
                self.reached.set()
                conn.sendall(prompt)
                prompt = b""

    def close(self) -> None:
        self.listener.close()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


@dataclass
class Lab:
    client: Callable[..., httpx2.AsyncClient]
    rules: Any
    exporter: FakeExporter       # host-a: b0, the waiting call's device
    other: FakeExporter          # host-b: b1, reserved and released meanwhile
    console: Silent
    camera: Silent
    report: dict                 # what host-a reports, again and again (nothing changes)

    async def beat(self) -> None:
        answer = await self.exporter.beat(**self.report)
        assert answer.status_code == 200, answer.text

    async def serve_b0(self, lease: dict) -> None:
        console = EndpointReport(kind="uart", role="console", protocol="raw", host="127.0.0.1", port=self.console.port)
        camera = EndpointReport(kind="video", role="http-stream", host="127.0.0.1", port=self.camera.port,
                                params={"snapshot": "snapshot.jpg", "stream": "stream.mjpg"})
        services = [ServiceReport(lease=lease["id"], device="b0", identifier="sim:b0", kind="uart",
                                  endpoints=[console, camera]).model_dump(exclude_none=True)]
        self.report = {**self.report, "services": services, "applied": [lease["id"]]}
        await self.beat()

    def mcp(self, user: str) -> Client:
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=self.client.app, client=("127.0.0.1", 123)),
                                  headers={"X-Device-Loop-User": user}, timeout=WAIT_S + 30)
        return Client(streamable_http_client("http://127.0.0.1/mcp", http_client=http))


def _board_with_an_operation() -> dict:
    """b0 as its exporter reports it, with a non-exclusive operation 'probe' to ask for."""
    report = device("b0")
    report["resources"][0]["operations"] = [OperationKindReport(kind="probe", exclusive=False).model_dump()]
    return report


@contextlib.asynccontextmanager
async def lab(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, _clock):
        console, camera = Silent(prompt=b"\r\n# "), Silent()
        try:
            a, b = FakeExporter(client("exporter"), "host-a"), FakeExporter(client("exporter"), "host-b")
            here = Lab(client, rules, a, b, console, camera, {"devices": [_board_with_an_operation()],
                                                                         "address": "127.0.0.1"})
            await here.beat()
            assert (await b.beat([device("b1")])).status_code == 200
            yield here
        finally:
            console.close()
            camera.close()


# ---- the calls that wait: how each is made to wait, and how it is seen waiting -----------------

async def _long_polling(lab: Lab, before: int) -> bool:
    return lab.rules.life.notifier.waiting > before


Started = tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[bool]]]


async def _lease_b0(lab: Lab, serve: bool = True) -> tuple[httpx2.AsyncClient, dict]:
    alice = lab.client("alice")
    lease = (await alice.post("/leases", json={"device": "b0"})).json()
    if serve:
        await lab.serve_b0(lease)
    return alice, lease


def _polling(lab: Lab, request: Callable[[], Awaitable[Any]]) -> Started:
    before = lab.rules.life.notifier.waiting
    return request, lambda: _long_polling(lab, before)


async def desired(lab: Lab, key: str | None) -> Started:
    etag = (await lab.exporter.client.get("/hosts/host-a/desired")).json()["etag"]
    return _polling(lab, lambda: lab.exporter.client.get("/hosts/host-a/desired",
                                                         params={"etag": etag, "wait": WAIT_S}))


async def ticket_status(lab: Lab, key: str | None) -> Started:
    await _lease_b0(lab)
    bob = lab.client("bob")
    ticket = (await bob.post("/leases", json={"device": "b0", "queue": True})).json()
    assert ticket.get("state") == "waiting", ticket
    return _polling(lab, lambda: bob.get(f"/tickets/{ticket['ticket']}", params={"wait_s": WAIT_S}))


async def claim_ticket(lab: Lab, key: str | None) -> Started:
    await _lease_b0(lab)
    bob = lab.client("bob")
    ticket = (await bob.post("/leases", json={"device": "b0", "queue": True, "keepalive_s": 30})).json()
    assert ticket.get("state") == "waiting", ticket
    return _polling(lab, lambda: bob.post(f"/tickets/{ticket['ticket']}/claim", json={"wait_s": WAIT_S}))


async def lease_status(lab: Lab, key: str | None) -> Started:
    alice, lease = await _lease_b0(lab, serve=False)  # pending: its services are not up
    return _polling(lab, lambda: alice.get(f"/leases/{lease['id']}", params={"wait": WAIT_S}))


async def operation_status(lab: Lab, key: str | None) -> Started:
    alice, lease = await _lease_b0(lab)
    op = (await alice.post(f"/leases/{lease['id']}/operations", json={"kind": "probe"})).json()
    assert op.get("state") == "queued", op
    return _polling(lab, lambda: alice.get(f"/ops/{op['id']}", params={"wait": WAIT_S}))


async def job_status(lab: Lab, key: str | None) -> Started:
    alice = lab.client("alice")
    job = (await alice.post("/jobs", json={"spec": {"target": {"device": "b0"}, "run": ["true"]}})).json()
    assert job.get("state") == "queued", job
    return _polling(lab, lambda: alice.get(f"/jobs/{job['id']}", params={"wait": WAIT_S}))


async def claim_job(lab: Lab, key: str | None) -> Started:
    worker = lab.client("alice")
    headers = {"Idempotency-Key": key} if key else {}
    return _polling(lab, lambda: worker.post("/jobs/claim", json={"wait_s": WAIT_S}, headers=headers))


def _tool(lab: Lab, name: str, args: dict, reached: threading.Event) -> Started:
    async def call() -> Any:
        async with lab.mcp("alice") as agent:
            return await agent.call_tool(name, args)

    async def waiting() -> bool:
        return reached.is_set()
    return call, waiting


async def exec_command(lab: Lab, key: str | None) -> Started:
    _, lease = await _lease_b0(lab)
    return _tool(lab, "exec", {"lease_id": lease["id"], "command": "true", "timeout_s": WAIT_S}, lab.console.reached)


async def uart_exchange(lab: Lab, key: str | None) -> Started:
    _, lease = await _lease_b0(lab)
    return _tool(lab, "uart_exchange", {"lease_id": lease["id"], "send": "\r", "wait_s": 10}, lab.console.reached)


async def fingerprint(lab: Lab, key: str | None) -> Started:
    _, lease = await _lease_b0(lab)
    return _tool(lab, "fingerprint", {"lease_id": lease["id"]}, lab.console.reached)


async def camera_snapshot(lab: Lab, key: str | None) -> Started:
    _, lease = await _lease_b0(lab)
    return _tool(lab, "camera_snapshot", {"lease_id": lease["id"]}, lab.camera.reached)


#: Every call that waits, by name. The calls with a wait_s or timeout_s must all be here (the
#: test below); fingerprint and camera_snapshot wait on a device without one.
WAITERS: dict[str, Callable[[Lab, str | None], Awaitable[Started]]] = {
    "desired": desired, "ticket_status": ticket_status, "claim_ticket": claim_ticket,
    "lease_status": lease_status,
    "operation_status": operation_status, "job_status": job_status, "claim_job": claim_job, "exec": exec_command,
    "uart_exchange": uart_exchange, "fingerprint": fingerprint, "camera_snapshot": camera_snapshot,
}


def test_every_call_that_waits_is_walked():
    takes_a_wait = {c.name for c in CALLS if {"wait_s", "timeout_s"} & set(c.args.model_fields)}
    assert takes_a_wait <= set(WAITERS), f"a call that waits is not walked here: {takes_a_wait - set(WAITERS)}"
    assert set(WAITERS) <= {c.name for c in CALLS}


# ---- what must not wait for it -----------------------------------------------------------------

async def _holds_nothing(lab: Lab) -> None:
    """No transaction is open anywhere in the lab now."""
    store = lab.rules.store
    if store.dialect == "sqlite":
        assert not store.driver.lock.locked(), "a waiting call holds SQLite's one writer"
        assert not store.driver.writer.in_transaction
        return
    rows = await store.read("SELECT state, query FROM pg_stat_activity WHERE datname = current_database() "
                            "AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()")
    assert rows == [], f"a waiting call holds a PostgreSQL transaction: {rows}"


async def _quickly(what: str, call: Awaitable[httpx2.Response], expected: int) -> dict:
    try:
        answer = await asyncio.wait_for(call, QUICK_S)
    except asyncio.TimeoutError:
        raise AssertionError(f"{what} waited for the waiting call") from None
    assert answer.status_code == expected, f"{what}: {answer.status_code} {answer.text}"
    return answer.json()


def _cases():
    for name in sorted(WAITERS):
        yield pytest.param(name, None, id=name)
        if name in KEYED:
            yield pytest.param(name, "key", id=f"{name}-with-idempotency-key")


@pytest.mark.parametrize(("name", "keyed"), list(_cases()))
async def test_nothing_waits_for_a_waiting_call(name, keyed, database, tmp_path):
    async with lab(tmp_path) as here:
        request, waiting = await WAITERS[name](here, uuid.uuid4().hex if keyed else None)
        waiter = asyncio.ensure_future(request())
        try:
            for _ in range(int(QUICK_S / 0.01)):  # (in this event loop: the waiter runs between these)
                if await waiting() or waiter.done():
                    break
                await asyncio.sleep(0.01)
            assert not waiter.done(), f"{name} did not wait: {waiter.result()}"
            assert await waiting(), f"{name} never began to wait"
            await _holds_nothing(here)
            carol = here.client("carol")
            lease = await _quickly("a reserve", carol.post("/leases", json={"device": "b1"},
                                                           headers={"Idempotency-Key": uuid.uuid4().hex}), 201)
            await _quickly("a release", carol.post(f"/leases/{lease['id']}/release"), 200)
            await _quickly("a heartbeat", here.exporter.beat(**here.report), 200)
            await _holds_nothing(here)
            assert not waiter.done(), f"{name} stopped waiting: {waiter.result()}"
        finally:
            waiter.cancel()
            with contextlib.suppress(BaseException):
                await waiter
