"""``device-loop images`` against a real coordinator."""
import hashlib
import json

import pytest

from helpers import run_cli, wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]


def test_images_from_the_command_line(tmp_path, env, coordinator, exporter_factory):
    exporter_factory()
    wait_state(coordinator, "sim-board-0", "idle")
    url = coordinator.url
    build = tmp_path / "jupiter.img"
    build.write_bytes(b"\x7fELF" + bytes(range(256)) * 8192)
    sha = hashlib.sha256(build.read_bytes()).hexdigest()

    uploaded = run_cli(env, url, "images", "upload", str(build), "--name", "jupiter-v1", "--for", "sim-board",
                       "--description", "nightly", "--json")
    image = json.loads(uploaded.stdout)
    assert (image["sha256"], image["for"], image["size"]) == (sha, "class:sim-board", build.stat().st_size)
    assert "[#" not in uploaded.stderr, "no progress bar when the output is not a terminal"
    assert (tmp_path / "coord" / "images" / sha).read_bytes() == build.read_bytes()

    table = run_cli(env, url, "images", "ls", "--device", "sim-board-0").stdout
    assert "jupiter-v1" in table and sha[:12] in table
    run_cli(env, url, "images", "mark-good", "jupiter-v1", "--for", "sim-board")
    refused = run_cli(env, url, "images", "rm", sha, "--json", check=False)
    assert refused.returncode == 1 and json.loads(refused.stdout)["error"] == "only_known_good"
    assert "removed: nothing" in run_cli(env, url, "images", "gc", "--days", "0").stdout
    missing = run_cli(env, url, "images", "upload", str(build), "--name", "x", "--for", "no-such-thing", "--json",
                      check=False)
    assert missing.returncode == 1 and json.loads(missing.stdout)["error"] == "unknown_target"
