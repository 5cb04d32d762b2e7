"""``device-loop cdi DEVICE|LEASE`` with real coordinator and exporter processes: the spec the
exporter wrote, and the name podman takes; only the lease's holder gets it; a class CDI cannot
take is refused in words (docs/architecture.md, "Containers and CDI")."""
import json

import pytest

from conftest import wait_for
from helpers import reserve, run_cli, wait_active, wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]


def test_cdi_prints_or_writes_the_spec_the_exporter_wrote_for_the_holder_only(tmp_path, env, coordinator,
                                                                               exporter_factory):
    exporter_factory()
    wait_state(coordinator, "sim-board-0", "idle")
    lease = wait_active(coordinator, reserve(coordinator, "sim-board-0")["id"])
    written = tmp_path / "cdi" / f"device-loop_host-a_{lease['id']}.json"
    wait_for(written.exists, what="the lease's CDI spec")

    shown = run_cli(env, coordinator.url, "cdi", "sim-board-0")
    assert json.loads(shown.stdout) == json.loads(written.read_text())
    assert "podman run --device device-loop.dev/sim-board=sim-board-0" in shown.stderr
    assert f"device-loop_host-a_{lease['id']}.json" in shown.stderr

    out = tmp_path / "mine.json"
    wrote = run_cli(env, coordinator.url, "cdi", lease["id"], "--output", str(out))
    assert json.loads(out.read_text()) == json.loads(written.read_text())
    assert "cdiVersion 0.3.0" in wrote.stdout and "device-loop.dev/sim-board=sim-board-0" in wrote.stdout

    answer = json.loads(run_cli(env, coordinator.url, "cdi", "sim-board-0", "--json").stdout)
    assert (answer["device_name"], answer["cdi_version"], answer["host"], answer["note"]) == (
        "device-loop.dev/sim-board=sim-board-0", "0.3.0", "host-a", None)

    by_id = run_cli(env, coordinator.url, "--user", "bob", "cdi", lease["id"], check=False)
    assert by_id.returncode == 1 and f"unknown lease '{lease['id']}'" in by_id.stderr
    by_name = run_cli(env, coordinator.url, "--user", "bob", "cdi", "sim-board-0", check=False)
    assert by_name.returncode == 1 and "held by alice" in by_name.stderr

    from device_loop.client.lab import Lab
    mine = Lab(coordinator.url, user="alice").lease(lease["id"]).cdi()  # the Python library's way
    assert mine["spec"] == json.loads(written.read_text()) and mine["file"] == written.name

    coordinator.api(f"/leases/{lease['id']}/release", "POST")
    ended = coordinator.api(f"/leases/{lease['id']}/cdi")
    assert ended.status_code == 409 and ended.json()["error"] == "lease_ended"


def test_a_class_cdi_cannot_name_is_refused_in_words(tmp_path, env, coordinator, exporter_factory):
    exporter = exporter_factory([{"name": "board-x", "plugin": "sim", "class": "x"}])
    wait_state(coordinator, "board-x", "idle")
    lease = wait_active(coordinator, reserve(coordinator, "board-x")["id"])
    refused = coordinator.api(f"/leases/{lease['id']}/cdi")
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "no_cdi_spec" and "one-letter class" in refused.json()["message"]
    wait_for(lambda: "no CDI spec for" in exporter.output(), what="the exporter saying why it wrote none")
    assert not (tmp_path / "cdi").exists() or list((tmp_path / "cdi").iterdir()) == []
