"""Cameras: the video plugin's MJPEG service from the simulated source, read by real HTTP
clients and decoded with OpenCV; its gate in a lab with tokens; the CLI and the agent tool;
V4L2 discovery on a fake sysfs tree (no camera is plugged into these machines)."""
import json
import re
import shutil
import subprocess
import threading

import cv2
import httpx2
import numpy as np
import pytest
from pydantic import ValidationError

from conftest import WAIT_S, Coordinator, Exporter, lab_tokens, wait_for
from device_loop.core.gate import LocalForward
from device_loop.core.host import HostContext
from device_loop.core.model import ConfiguredResource
from device_loop.plugins import video
from fake_sysfs import UVC, usb_device, v4l2_node
from helpers import run_cli, wait_state, write_clip
from test_mcp import agent

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]
SIZE = (320, 240)


def with_camera(name: str, **camera) -> dict:
    camera = {k: v for k, v in {"source": "sim", "width": SIZE[0], "height": SIZE[1], "fps": 20, **camera}.items()
              if v is not None}
    return {"name": name, "class": "sim-board", "resources": [{"plugin": "sim"}, {"plugin": "video", **camera}]}


def camera_of(lease: dict) -> dict:
    return next(e for e in lease["endpoints"] if e["kind"] == "video")


def frames(url: str, count: int, timeout: float = 15, into: list | None = None) -> list[np.ndarray]:
    """Read ``count`` frames of an MJPEG stream (fewer if it ends), decoded (into ``into``
    as they come, if given)."""
    got, buffer = ([] if into is None else into), b""
    with httpx2.stream("GET", url, timeout=timeout) as response:
        assert response.status_code == 200, response.read()
        boundary = response.headers["content-type"].split("boundary=")[1].encode()
        for chunk in response.iter_bytes():
            buffer += chunk
            while (head := buffer.find(b"\r\n\r\n")) != -1 and buffer.startswith(b"--" + boundary + b"\r\n"):
                length = int(next(line.split(b":")[1] for line in buffer[:head].split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                if len(buffer) < head + 4 + length + 2:
                    break
                jpeg = buffer[head + 4:head + 4 + length]
                buffer = buffer[head + 4 + length + 2:]
                got.append(cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR))
                if len(got) == count:
                    return got
    return got


def test_a_sim_camera_streams_to_two_viewers_and_ends_when_it_fails(tmp_path, env, coordinator, exporter_factory):
    exporter = exporter_factory([with_camera("sim-board-0")])
    wait_state(coordinator, "sim-board-0", "idle")
    lease = json.loads(run_cli(env, coordinator.url, "reserve", "sim-board-0", "--wait", "--json").stdout)
    camera = camera_of(lease)
    assert camera["protocol"] == "http" and lease["ready"]
    base = camera["url"]

    seen = {}
    viewers = [threading.Thread(target=lambda n=n: seen.__setitem__(n, frames(base + "stream.mjpg", 5)))
               for n in range(2)]
    for viewer in viewers:
        viewer.start()
    for viewer in viewers:
        viewer.join(WAIT_S)
    assert [len(seen[n]) for n in range(2)] == [5, 5], "both viewers get frames at once"
    assert all(frame.shape == (SIZE[1], SIZE[0], 3) for frame in seen[0] + seen[1])
    assert not np.array_equal(seen[0][0], seen[0][-1]), "the pattern moves"

    snapshot = httpx2.get(base + "snapshot.jpg", timeout=10)
    assert snapshot.status_code == 200 and snapshot.headers["content-type"] == "image/jpeg"
    assert cv2.imdecode(np.frombuffer(snapshot.content, np.uint8), cv2.IMREAD_COLOR).shape == (SIZE[1], SIZE[0], 3)
    cli = tmp_path / "frame.jpg"
    run_cli(env, coordinator.url, "video", "sim-board-0", "--snapshot", str(cli))
    assert cv2.imread(str(cli)).shape == (SIZE[1], SIZE[0], 3)
    urls = json.loads(run_cli(env, coordinator.url, "video", "sim-board-0", "--json").stdout)
    assert urls["stream"] == base + "stream.mjpg"

    watched: list = []
    ended: list = []  # how the watcher's stream ended: its frames (it ended), or what its read raised

    def watch() -> None:
        try:
            ended.append(frames(base + "stream.mjpg", 10_000, into=watched))
        except httpx2.HTTPError as exc:  # (a read left hanging times out)
            ended.append(exc)
    watcher = threading.Thread(target=watch)
    watcher.start()
    wait_for(lambda: len(watched) >= 2, what="the stream flowing before the camera fails")
    switch = video.fail_switch(HostContext("host-a", exporter.state_dir), "sim-board-0")
    switch.parent.mkdir(parents=True, exist_ok=True)
    switch.write_text("lens cap on")
    watcher.join(WAIT_S)
    assert not watcher.is_alive() and len(ended) == 1 and ended[0] is watched, \
        f"the stream ends when the source fails, viewers are not left hanging: {[e for e in ended if e is not watched]}"
    wait_for(lambda: coordinator.api("/devices/sim-board-0").json()["health"] == "failed", what="health failed")
    assert "lens cap on" in coordinator.api("/devices/sim-board-0").json()["health_reason"]
    assert httpx2.get(base + "snapshot.jpg", timeout=10).status_code == 503


@pytest.fixture
def gated_lab(tmp_path, env):
    coordinator = Coordinator(tmp_path, env, extra=())
    made, token_file = lab_tokens(env, coordinator, tmp_path, "alice")
    exporter = Exporter(tmp_path, env, coordinator.url, [with_camera("sim-board-0")], token_file=str(token_file))
    wait_for(lambda: httpx2.get(f"{coordinator.url}/api/v1/devices/sim-board-0").json().get("state") == "idle")
    yield coordinator, {**env, "DEVICE_LOOP_TOKEN": made["alice"]}
    exporter.stop()
    coordinator.stop()


def test_behind_the_gate_only_the_lease_s_url_shows_frames(gated_lab):
    coordinator, env = gated_lab
    lease = json.loads(run_cli(env, coordinator.url, "reserve", "sim-board-0", "--wait", "--json").stdout)
    camera = camera_of(lease)
    secret_url, secret = camera["url"], camera["secret"]
    assert secret in secret_url, "the capability is in the URL, which only the holder gets"
    bare = f"http://{camera['host']}:{camera['port']}/"
    console = next(e for e in lease["endpoints"] if e["role"] == "console")
    for path in ("stream.mjpg", "snapshot.jpg", "", f"not-{secret}/stream.mjpg", f"{console['secret']}/stream.mjpg"):
        refused = httpx2.get(bare + path, timeout=10)
        assert refused.status_code == 403 and b"\xff\xd8" not in refused.content, path
    assert len(frames(secret_url + "stream.mjpg", 2)) == 2
    assert httpx2.get(secret_url + "snapshot.jpg", timeout=10).content.startswith(b"\xff\xd8")
    with LocalForward(camera, secret) as forward:  # what device-loop forward does
        local = f"http://{forward.endpoint['host']}:{forward.endpoint['port']}/snapshot.jpg"
        assert httpx2.get(local, timeout=10).content.startswith(b"\xff\xd8")
    anonymous = json.loads(run_cli({**env, "DEVICE_LOOP_TOKEN": ""}, coordinator.url, "ls", "--json").stdout)
    assert secret not in json.dumps(anonymous)

    run_cli(env, coordinator.url, "release", lease["id"])
    wait_state(coordinator, "sim-board-0", "idle")
    try:
        after = httpx2.get(secret_url + "snapshot.jpg", timeout=5)
        assert after.status_code == 403
    except httpx2.ConnectError:
        pass  # its gate is gone with the lease: nothing answers there at all


@pytest.mark.anyio
async def test_an_agent_sees_the_board_s_screen(tmp_path, env, coordinator, exporter_factory):
    exporter_factory([with_camera("sim-board-0")])
    wait_state(coordinator, "sim-board-0", "idle")
    async with agent(coordinator.url) as bot:
        lease = (await bot.call_tool("reserve", {"device": "sim-board-0"})).structured_content
        wait_for(lambda: coordinator.api(f"/leases/{lease['id']}", headers={}).json().get("ready"))
        shot = await bot.call_tool("camera_snapshot", {"lease_id": lease["id"]})
        assert not shot.is_error, shot.content
        image = shot.content[0]
        assert image.type == "image" and image.mime_type == "image/jpeg"
        import base64
        decoded = cv2.imdecode(np.frombuffer(base64.b64decode(image.data), np.uint8), cv2.IMREAD_COLOR)
        assert decoded.shape == (SIZE[1], SIZE[0], 3)


def test_v4l2_cameras_are_found_by_usb_serial_not_by_node_name(tmp_path):
    sysfs = tmp_path / "sys"
    camera = usb_device(sysfs, "1-1.3", vendor="046d", product="0825", serial="CAM123", interfaces=(UVC, UVC))
    v4l2_node(sysfs, "video2", camera, interface=0, index=0)
    v4l2_node(sysfs, "video3", camera, interface=0, index=1)  # its metadata node
    cheap = usb_device(sysfs, "1-1.4", vendor="1b3f", product="2247", serial=None, interfaces=(UVC,))
    v4l2_node(sysfs, "video0", cheap)
    entries = [ConfiguredResource("jupiter", "riscv-sbc", (), "video", video.VideoConfig(usb_serial="CAM123")),
               ConfiguredResource("phone", "android", (), "video", video.VideoConfig(usb_serial="ABSENT")),
               ConfiguredResource("bmc", "bmc", (), "video", video.VideoConfig(usb_port="1-1.4"))]
    host = HostContext("host-a", tmp_path / "state", sysfs_root=sysfs, entries=entries)
    found = video.devloop_discover(host)
    assert [(r.device, r.identifier, r.node) for r in found] == [
        ("jupiter", "v4l2:046d:0825:CAM123", "/dev/video2"), ("bmc", "v4l2:1b3f:2247:port-1-1.4", "/dev/video0")]
    assert "ABSENT" in video.devloop_check_config(host, entries[1])
    with pytest.raises(ValidationError, match="exactly one of"):
        video.VideoConfig()


def send_buffer_full(port: int, peer_port: int) -> bool:
    """Whether the socket of local ``port`` connected to local ``peer_port`` can take no more
    (its queued bytes reached its send buffer: a write would block), as ``ss`` shows it."""
    assert shutil.which("ss"), "this test reads socket buffers with ss (Debian: iproute2)"
    shown = subprocess.run(["ss", "-tmnH", "state", "established", f"( sport = :{port} and dport = :{peer_port} )"],
                           capture_output=True, text=True, check=True).stdout
    memory = re.search(r"\btb(\d+),f\d+,w(\d+)", shown)
    return bool(memory) and int(memory[2]) >= int(memory[1])


def sim_frame_number(frame: np.ndarray) -> int:
    """Which frame of the simulated camera ``frame`` is, modulo a quarter of its width: its
    pattern moves 4 pixels a frame (plugins/video/sources.py), so the column where the bottom
    row's blue ramp falls from 255 to 0 tells how far it has moved."""
    ramp = frame[-1, :, 0].astype(int)
    return round(int(np.argmax(np.roll(ramp, 1) - ramp)) / 4) % (frame.shape[1] // 4)


def frames_spanned(got: list[np.ndarray]) -> int:
    """How many frames the simulated camera made from the first of ``got`` to the last (``got``
    in the order they came; fewer than a quarter of its width apart each)."""
    numbers = [sim_frame_number(frame) for frame in got]
    return sum((later - earlier) % (got[0].shape[1] // 4) for earlier, later in zip(numbers, numbers[1:]))


def test_a_viewer_that_reads_nothing_slows_no_one(tmp_path, env, coordinator, exporter_factory):
    import socket
    # big frames (3 MB/s), so that the camera's buffers for a viewer fill in a second, not ten
    fps, count = 20, 40
    exporter_factory([with_camera("sim-board-0", width=1280, height=960, fps=fps, quality=100)])
    wait_state(coordinator, "sim-board-0", "idle")
    lease = json.loads(run_cli(env, coordinator.url, "reserve", "sim-board-0", "--wait", "--json").stdout)
    camera = camera_of(lease)
    stuck = socket.create_connection((camera["host"], camera["port"]))
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.sendall(b"GET /stream.mjpg HTTP/1.1\r\nHost: x\r\n\r\n")  # and never reads a byte
    wait_for(lambda: send_buffer_full(camera["port"], stuck.getsockname()[1]),
             what="the camera's socket to the stuck viewer to be full (a write to it would block)")
    got = frames(camera["url"] + "stream.mjpg", count)
    # at the camera's pace: timed by the camera's own frames (it makes fewer on a busy machine,
    # and so sends fewer); how fast they flow is bench/video.py's
    spanned = frames_spanned(got)
    assert len(got) == count and spanned < 1.75 * count, \
        f"{count} frames came while the camera made {spanned + 1} beside a stuck viewer"
    stuck.close()


def test_a_video_file_is_a_camera_too(tmp_path, env, coordinator, exporter_factory):
    clip = write_clip(tmp_path / "screen.avi")
    exporter_factory([with_camera("sim-board-0", source=None, file=str(clip))])
    wait_state(coordinator, "sim-board-0", "idle")
    lease = json.loads(run_cli(env, coordinator.url, "reserve", "sim-board-0", "--wait", "--json").stdout)
    got = frames(camera_of(lease)["url"] + "stream.mjpg", 25)
    assert len(got) == 25, "the file plays in a loop"
    assert all(frame.shape == (SIZE[1], SIZE[0], 3) for frame in got), "scaled to the configured size"
    assert len({int(frame.mean()) // 20 for frame in got}) >= 5, "its frames, not one picture"


def test_a_misspelt_key_is_refused():
    with pytest.raises(ValidationError, match="qualty"):
        video.VideoConfig(source="sim", qualty=50)


def test_a_camera_that_cannot_open_fails_the_start_with_the_reason(tmp_path, env, coordinator, exporter_factory):
    junk = tmp_path / "notavideo.mp4"
    junk.write_bytes(b"this is no video")
    exporter_factory([with_camera("sim-board-0", source=None, file=str(junk))])
    wait_state(coordinator, "sim-board-0", "idle")
    lease = json.loads(run_cli(env, coordinator.url, "reserve", "sim-board-0", "--json").stdout)

    def reason():
        said = coordinator.api(f"/leases/{lease['id']}").json()["reason"]
        return said if "cannot be used" in said else None
    assert "the camera cannot be used: cannot open" in wait_for(reason, what="the start's failure")
