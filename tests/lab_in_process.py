"""A coordinator app in this process, with a clock the test moves by hand."""
from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
import uuid

import httpx2

from device_loop.coordinator.app import create_app
from device_loop.coordinator.rules import Settings
from device_loop.core import PROTOCOL_VERSION
from device_loop.core.protocol import (DeviceReport, EndpointReport, Heartbeat, Holder, OperationKindReport,
                                       PluginsReport, ResourceReport, ServiceReport)
from device_loop.core.vocabulary import Fidelity, HealthStatus
from lab_databases import database_url, give_back, migrated_sqlite_template, take_migrated_database


class FakeClock:
    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


#: The PostgreSQL server the ``database`` fixture (conftest.py) points in-process labs at: an
#: admin URL (each lab gets a database of its own there: ``_database``), or None for SQLite.
POSTGRES: dict[str, str | None] = {"admin_url": None}

#: The pool of a lab's Store on PostgreSQL (``databases`` reads it from the URL's query): one
#: connection opened at the start, where the default opened ten, a server process each (a
#: lab's calls mostly come one at a time); at most ten, the default, so that the tests that
#: race transactions (claims, reserves, long-polls at once) race as many as a coordinator does.
LAB_POOL = "min_size=1&max_size=10"


@contextlib.asynccontextmanager
async def _database(tmp_path, migrated: bool = False):
    """A database for one lab, which nobody else uses meanwhile: a SQLite file, or a
    PostgreSQL database; empty, or (``migrated``) as a coordinator leaves it at the latest
    migration, with nothing else in it (on SQLite a copy of a migrated file, on PostgreSQL
    one of this process's databases reset: ``take_migrated_database``)."""
    admin_url = POSTGRES["admin_url"]
    if admin_url is None:
        path = tmp_path / f"lab-{uuid.uuid4().hex[:6]}.sqlite"
        if migrated:
            shutil.copyfile(await migrated_sqlite_template(), path)
        yield f"sqlite:///{path}"
        return
    if migrated:
        name = await take_migrated_database(admin_url)
        try:
            yield database_url(admin_url, name)
        finally:
            give_back(admin_url, name)
        return
    import asyncpg

    name = f"lab_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
        yield database_url(admin_url, name)
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()


@contextlib.asynccontextmanager
async def in_process_lab(tmp_path, single_user=True, tailnet_socket=None, tailnet_admins=(), **settings):
    """(client factory, rules, clock): ``client(user)`` talks to the app as ``user`` (in the
    single-user trust mode, by default), ``client(token=T)`` with a token."""
    settings.setdefault("reaper_interval_s", 3600)
    settings.setdefault("image_dir", str(tmp_path / "images"))
    async with _database(tmp_path, migrated=True) as url:
        async with _lab(url, single_user, tailnet_socket, tailnet_admins, settings) as lab:
            yield lab


@contextlib.asynccontextmanager
async def _lab(url: str, single_user, tailnet_socket, tailnet_admins, settings):
    if url.startswith("postgres") and "?" not in url:
        url = f"{url}?{LAB_POOL}"
    app = create_app(url, Settings(**settings),
                     single_user=single_user, tailnet_socket=tailnet_socket, tailnet_admins=tailnet_admins)
    clock = FakeClock()
    app.state.rules.clock = clock
    clients = []

    def client(user: str = "alice", token: str | None = None, peer=("127.0.0.1", 123)) -> httpx2.AsyncClient:
        headers = {"X-Device-Loop-User": user} | ({"Authorization": f"Bearer {token}"} if token else {})
        c = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app, client=peer), base_url="http://127.0.0.1/api/v1",
                               headers=headers)
        clients.append(c)
        return c

    client.app = app  # type: ignore[attr-defined]  (the app itself: for an MCP client, say)

    async with app.router.lifespan_context(app):
        rules = app.state.rules
        while rules.reap_passes == 0:  # the start's own pass: its statements are no test's
            await asyncio.sleep(0.005)
        try:
            yield client, app.state.rules, clock
        finally:
            for c in clients:
                await c.aclose()


def device(name: str, identifier: str | None = None, health: str = "ok", busy_by=(), kind="uart",
           fidelity: str = "hardware", device_class: str = "sim-board", tags=("sim",), facts=None) -> dict:
    """A device as an exporter reports it (unchecked: tests send bad ones too): ``fidelity`` is
    what its plugin says it is (hardware, simulated, virtual, emulated), ``facts`` what its
    plugins add to its fingerprint (``fidelity.detail``: ``TCG``)."""
    resource = ResourceReport.model_construct(kind=kind, plugin="sim", identifier=identifier or f"sim:{name}",
                                              health=HealthStatus(health), reason="" if health == "ok" else "broken",
                                              service=True, operations=[])
    return DeviceReport.model_construct(name=name, device_class=device_class, tags=list(tags), resources=[resource],
                                        busy_by=[Holder.model_construct(**h) for h in busy_by],
                                        fidelity=Fidelity(fidelity) if fidelity in set(Fidelity) else fidelity,
                                        facts=dict(facts or {})).model_dump(by_alias=True)


def flash_target(name: str) -> dict:
    """A device's flash target as the flash plugin reports it: no service for a lease, and the
    one operation it runs, ``flash`` (destructive: a failure part-way needs recovery)."""
    return ResourceReport(kind="flash", plugin="flash", identifier=f"flash:host-a:{name}", service=False,
                          operations=[OperationKindReport(kind="flash", exclusive=True, destructive=True,
                                                          description="write an image")]).model_dump()


def board(name: str = "b0") -> dict:
    """A board with a console and a flash target, as an exporter reports it."""
    report = device(name)
    report["resources"].append(flash_target(name))
    return report


class FakeExporter:
    """Sends heartbeats the way an exporter does, with a generation per boot."""

    def __init__(self, client: httpx2.AsyncClient, name: str):
        self.client, self.name = client, name
        self.boot_id = uuid.uuid4().hex
        self.generation = 0

    def reboot(self) -> None:
        self.boot_id, self.generation = uuid.uuid4().hex, 0

    def report(self, devices=(), services=(), applied=(), generation=None, **extra) -> dict:
        if generation is None:
            self.generation += 1
            generation = self.generation
        report = Heartbeat.model_construct(protocol=PROTOCOL_VERSION, version="test", boot_id=self.boot_id,
                                           generation=generation, heartbeat_s=1.0,
                                           plugins=PluginsReport.model_construct(loaded=["sim"]),
                                           devices=[], services=[], applied=list(applied))
        return {**report.model_dump(by_alias=True), "devices": list(devices), "services": list(services), **extra}

    async def beat(self, *args, **kwargs) -> httpx2.Response:
        return await self.client.post(f"/hosts/{self.name}/heartbeat", json=self.report(*args, **kwargs))

    async def serve(self, lease: dict, port: int = 4000, **kwargs) -> httpx2.Response:
        """Report the lease's service up (as the exporter does once it started it)."""
        service = ServiceReport(lease=lease["id"], device=lease["device"], identifier=f"sim:{lease['device']}",
                                kind="uart", endpoints=[EndpointReport(kind="uart", host="127.0.0.1", port=port)])
        return await self.beat([device(lease["device"])], [service.model_dump(exclude_none=True)], [lease["id"]],
                               **kwargs)


async def leased_board(client) -> tuple[httpx2.AsyncClient, FakeExporter, dict]:
    """Board b0 on host-a, leased by alice, its service up: (alice's client, exporter, lease)."""
    api = client()
    exporter = FakeExporter(api, "host-a")
    await exporter.beat([device("b0")])
    lease = (await api.post("/leases", json={"device": "b0"})).json()
    await exporter.serve(lease)
    return api, exporter, lease


async def reaper_passes(rules, more: int, interval_s: float) -> None:
    """Wait until the lab's reaper, passing every ``interval_s``, made ``more`` passes."""
    target = rules.reap_passes + more
    deadline = time.monotonic() + 100 * more * interval_s
    while rules.reap_passes < target:
        assert time.monotonic() < deadline, "the reaper stopped"
        await asyncio.sleep(interval_s)
