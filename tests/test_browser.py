"""In a real browser (Debian's Chromium, driven by Playwright): a lease's noVNC viewer shows
the virtual display, and a camera's MJPEG stream renders in an <img>. The screenshots are
kept in ``test-artifacts/``."""
import json
import subprocess

import cv2
import numpy as np
import pytest

from conftest import SRC
from helpers import run_cli, token_lab, wait_state
from test_video import with_camera

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]
ARTIFACTS = SRC / "test-artifacts"
ORANGE_BGR = (0, 128, 255)  # xsetroot -solid '#ff8000'


def screenshot(page, name: str) -> np.ndarray:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return cv2.imread(str(path))


def share_of(image: np.ndarray, bgr: tuple[int, int, int]) -> float:
    close = np.all(np.abs(image.astype(int) - np.array(bgr)) <= 12, axis=2)
    return float(close.mean())


#: the viewer's canvas shows the display's colour (#ff8000) at its middle
PAINTED_ORANGE = ("() => { const c = document.querySelector('canvas');"
                  " if (!c || c.width < 640) return false;"
                  " const [r, g, b] = c.getContext('2d').getImageData(c.width / 2, c.height / 2, 1, 1).data;"
                  " return r > 200 && g > 100 && g < 160 && b < 60; }")


def test_the_viewer_url_shows_the_screen(env, coordinator, exporter_factory, vnc_server, browser):
    port, number = vnc_server
    subprocess.run(["xsetroot", "-display", f":{number}", "-solid", "#ff8000"], check=True)
    exporter_factory([{"name": "desk", "class": "vm", "plugin": "vnc", "upstream": f"127.0.0.1:{port}"}])
    wait_state(coordinator, "desk", "idle")
    run_cli(env, coordinator.url, "reserve", "desk", "--wait")
    url = json.loads(run_cli(env, coordinator.url, "vnc", "desk", "--json").stdout)["browser"]
    page = browser.new_page(viewport={"width": 1000, "height": 700})
    page.goto(url)
    page.wait_for_selector("canvas")
    page.wait_for_function("() => { const c = document.querySelector('canvas');"
                           " return c && c.width >= 640 && c.height >= 480; }")
    page.wait_for_function(PAINTED_ORANGE)  # the first frame update
    shot = screenshot(page, "novnc-viewer")
    assert share_of(shot, ORANGE_BGR) > 0.2, "the display's colour is not on the viewer page"


def test_behind_its_gate_a_display_s_viewer_shows_the_screen(tmp_path, env, display, browser):
    """A token lab: x11vnc serves the display on a unix socket only the gate reaches, websockify
    bridges only a websocket whose token is the lease's secret, and the viewer's URL (the
    capability in its path) carries both through the gate: the screen shows."""
    desk = {"name": "desk", "class": "vm", "plugin": "vnc", "display": f":{display}"}
    with token_lab(tmp_path, env, [desk], "alice") as (coordinator, _, users):
        lease = json.loads(run_cli(users["alice"], coordinator.url, "reserve", "desk", "--wait", "--json").stdout)
        (web,) = [e for e in lease["endpoints"] if e["kind"] == "vnc-web"]
        page = browser.new_page(viewport={"width": 1000, "height": 700})
        page.goto(web["url"])
        # connected: x11vnc serves the display to the viewer
        page.wait_for_function("() => { const c = document.querySelector('canvas'); return c && c.width >= 640; }")
        # (painted once it does: it sends what changes, as a screen's user sees it)
        subprocess.run(["xsetroot", "-display", f":{display}", "-solid", "#ff8000"], check=True)
        page.wait_for_function(PAINTED_ORANGE)
        shot = screenshot(page, "novnc-viewer-gated")
        assert share_of(shot, ORANGE_BGR) > 0.2, "the display's colour is not on the gated viewer page"


def test_the_camera_stream_renders_in_an_img(env, coordinator, exporter_factory, browser):
    exporter_factory([with_camera("sim-board-0")])
    wait_state(coordinator, "sim-board-0", "idle")
    run_cli(env, coordinator.url, "reserve", "sim-board-0", "--wait")
    urls = json.loads(run_cli(env, coordinator.url, "video", "sim-board-0", "--json").stdout)
    page = browser.new_page(viewport={"width": 800, "height": 600})
    page.goto(urls["page"])
    page.wait_for_function("() => { const i = document.querySelector('img'); return i && i.naturalWidth === 320; }")
    page.wait_for_timeout(500)
    shot = screenshot(page, "camera-stream")
    assert shot[40:200, 20:300].std() > 10, "the stream's picture is not on the page"
