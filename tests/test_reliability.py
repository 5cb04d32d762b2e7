"""Exclusivity that holds across coordinator processes: two real coordinators on one
PostgreSQL, and clients racing for the same devices through both."""
import asyncio

import httpx2
import pytest

from lab_in_process import FakeExporter, device

pytestmark = pytest.mark.timeout(120)


@pytest.mark.anyio
async def test_a_reserve_storm_through_two_processes_grants_each_device_once(two_coordinators):
    first, second = two_coordinators
    names = [f"b{i}" for i in range(20)]
    exporter_client = httpx2.AsyncClient(base_url=f"{first.url}/api/v1", timeout=30)
    exporter = FakeExporter(exporter_client, "host-a")
    answer = await exporter.beat([device(n) for n in names])
    assert answer.status_code == 200, answer.text

    async def heartbeats() -> None:  # the host stays online however long a storm takes on a busy machine
        while True:
            await asyncio.sleep(1)
            await exporter.beat([device(n) for n in names])

    beating = asyncio.get_running_loop().create_task(heartbeats())

    async def storm(targets: list[str], clients_per_device: int) -> dict[str, list[int]]:
        statuses: dict[str, list[int]] = {name: [] for name in targets}
        clients = [httpx2.AsyncClient(base_url=f"{c.url}/api/v1", timeout=60) for c in two_coordinators]

        async def one(name: str, n: int) -> None:
            response = await clients[n % 2].post("/leases", json={"device": name},
                                                 headers={"X-Device-Loop-User": f"racer-{name}-{n}"})
            assert response.status_code in (201, 409), response.text
            statuses[name].append(response.status_code)

        try:
            await asyncio.gather(*(one(name, n) for name in targets for n in range(clients_per_device)))
        finally:
            for client in clients:
                await client.aclose()
        return statuses

    single = await storm(["b0"], 50)
    assert sorted(single["b0"]) == [201] + [409] * 49, "exactly one lease; every other racer a clean 409"

    many = await storm(names[1:], 50)
    # (only the wrong ones, whole: pytest cuts a long dict's repr, and the wrong ones were in what it cut)
    wrong = {n: sorted(s) for n, s in many.items() if sorted(s) != [201] + [409] * 49}
    assert not wrong, f"devices whose racers were not one 201 and 49 409s: {wrong}"

    async with httpx2.AsyncClient(base_url=f"{second.url}/api/v1", timeout=30) as check:
        devices = (await check.get("/devices")).json()
    beating.cancel()
    await exporter_client.aclose()
    assert all(d["holder"] and d["holder"].startswith(f"racer-{d['name']}-") for d in devices)


def test_the_database_is_readable_by_its_account_only(tmp_path, env, coordinator):
    import stat
    folder = tmp_path / "coord"
    assert coordinator.api("/leases", "POST", json={"device": "nosuch"}).status_code == 404  # a write or two
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = [p for p in folder.iterdir() if p.name.startswith("coordinator.sqlite")]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files), \
        {p.name: oct(p.stat().st_mode) for p in files}
