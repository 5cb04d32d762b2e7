"""A refusal of a mistyped name says what it most likely meant and where the names are listed."""
import pytest

from lab_in_process import FakeExporter, device, in_process_lab

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("database")]


async def test_a_mistyped_device_or_image_is_answered_with_the_likely_one(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        await FakeExporter(api, "host-a").beat([device("sim-board-0"), device("sim-board-1"), device("jupiter")])
        for path in ("/devices/sim-bord-0", "/devices/sim-bord-0/log"):
            said = (await api.get(path)).json()
            assert said["error"] == "unknown_device", said
            assert "did you mean 'sim-board-0' or 'sim-board-1'?" in said["message"], said
            assert "known devices: jupiter" in said["message"]
        nothing_like = (await api.get("/devices/zzz")).json()["message"]
        assert "did you mean" not in nothing_like
        lease = (await api.post("/leases", json={"device": "sim-board-0"})).json()
        uploaded = await api.post("/images", params={"name": "sim-firmware-1.0", "for": "sim-board-0"},
                                  content=b"firmware" * 64)
        assert uploaded.status_code == 201, uploaded.text
        refused = (await api.post(f"/leases/{lease['id']}/flash", json={"image": "sim-firmwar-1.0"})).json()
        assert refused["error"] == "unknown_image"
        assert "did you mean 'sim-firmware-1.0'?" in refused["message"] and "images ls" in refused["message"]
