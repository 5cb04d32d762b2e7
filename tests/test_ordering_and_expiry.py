"""Two rules that only time shows, driven with the in-process coordinator's hand-moved clock:

- the exporter's desired state comes two ways, a heartbeat's answer and the long-poll's, and
  the two may cross on their way: the coordinator stamps each with the time it read the
  state (``as_of``), and an answer read before the one applied last changes nothing;
- an ``Idempotency-Key`` replays its first answer for as long as it is kept
  (``IDEMPOTENCY_KEPT_S``); once the reaper forgot it, a repeat is a new request.
"""
import pytest

from conftest import sim_devices
from device_loop.coordinator.rules import IDEMPOTENCY_KEPT_S
from device_loop.core.protocol import DesiredState
from exporter_testkit import in_process_exporter
from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def heartbeat(api, exporter) -> DesiredState:
    """The exporter's report, posted as its link posts it: the coordinator's answer."""
    response = await api.post("/hosts/host-a/heartbeat", content=exporter.report().model_dump_json(by_alias=True),
                              headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    return DesiredState.model_validate(response.json())


async def long_poll(api, etag: str) -> DesiredState:
    """The long-poll's answer: the desired state once its etag is not ``etag``."""
    response = await api.get("/hosts/host-a/desired", params={"etag": etag, "wait": 10})
    assert response.status_code == 200, response.text
    return DesiredState.model_validate(response.json())


def deliver(exporter, desired: DesiredState, from_heartbeat: bool = False) -> bool:
    """Hand the exporter an answer as its loop does, and wait for the starts and stops it
    began; True if one began."""
    began = exporter._apply(desired, from_heartbeat=from_heartbeat)
    assert exporter.reconciler.wait_idle(30)
    return began


def serving(exporter) -> list[str]:
    return sorted(lease for lease, _ in exporter.running)


@pytest.mark.service
async def test_of_two_desired_states_that_cross_the_one_read_later_wins(tmp_path):
    exporter = in_process_exporter(tmp_path, sim_devices("sim-board-0"))
    try:
        async with in_process_lab(tmp_path) as (client, rules, clock):
            api = client()
            exporter.step(scan=True)  # its resources (the heartbeat of that step reaches no one)
            deliver(exporter, await heartbeat(api, exporter), from_heartbeat=True)

            # a long-poll's answer read before the lease, on its way while the heartbeat's
            # answer, read after the lease was granted, comes first
            clock.advance(1)
            late_poll = await long_poll(api, "")  # (an etag it is not: answered at once)
            assert late_poll.services == []
            clock.advance(1)
            lease = (await api.post("/leases", json={"device": "sim-board-0"})).json()
            clock.advance(1)
            fresh_beat = await heartbeat(api, exporter)
            assert [s.lease for s in fresh_beat.services] == [lease["id"]] and fresh_beat.as_of > late_poll.as_of
            assert deliver(exporter, fresh_beat, from_heartbeat=True)
            assert serving(exporter) == [lease["id"]]
            assert not deliver(exporter, late_poll), "an answer read before the one applied changed something"
            assert serving(exporter) == [lease["id"]] and exporter.etag == fresh_beat.etag

            # a heartbeat's answer read before the release, on its way while the long-poll's
            # answer, read after it, comes first
            clock.advance(1)
            late_beat = await heartbeat(api, exporter)
            assert [s.lease for s in late_beat.services] == [lease["id"]]
            clock.advance(1)
            assert (await api.post(f"/leases/{lease['id']}/release")).status_code == 200
            fresh_poll = await long_poll(api, late_beat.etag)
            assert fresh_poll.services == [] and fresh_poll.as_of > late_beat.as_of
            assert deliver(exporter, fresh_poll)
            assert serving(exporter) == []
            assert not deliver(exporter, late_beat, from_heartbeat=True), \
                "an answer read before the one applied changed something"
            assert serving(exporter) == [] and exporter.etag == fresh_poll.etag
    finally:
        exporter.shutdown()


@pytest.mark.usefixtures("database")
async def test_an_idempotency_key_replays_while_it_is_kept_and_is_forgotten_after(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        exporter = FakeExporter(api, "host-a")
        await exporter.beat([device("b0")])
        key = {"Idempotency-Key": "reserve-b0-once"}
        first = await api.post("/leases", json={"device": "b0"}, headers=key)
        assert first.status_code == 201, first.text
        assert (await api.post(f"/leases/{first.json()['id']}/release")).status_code == 200

        async def repeat_after(seconds: float):
            clock.advance(seconds)
            await exporter.beat([device("b0")])  # (the host stays online)
            await rules.reap()
            return await api.post("/leases", json={"device": "b0"}, headers=key)

        replayed = await repeat_after(IDEMPOTENCY_KEPT_S - 1)
        assert (replayed.status_code, replayed.json()["id"]) == (201, first.json()["id"]), \
            "a key younger than its lifetime replays the first answer"
        assert (await api.get("/leases")).json() == [], "a replay reserves nothing"
        reused = await api.post("/leases", json={"device": "b1"}, headers=key)
        assert (reused.status_code, reused.json()["error"]) == (422, "idempotency_key_reused")

        again = await repeat_after(2)  # the key is a lifetime and a second old
        assert again.status_code == 201, again.text
        assert again.json()["id"] != first.json()["id"], "a key older than its lifetime was not forgotten"
        assert [lease["id"] for lease in (await api.get("/leases")).json()] == [again.json()["id"]]
        replayed = await api.post("/leases", json={"device": "b0"}, headers=key)
        assert replayed.json()["id"] == again.json()["id"], "the key now replays its new answer"
