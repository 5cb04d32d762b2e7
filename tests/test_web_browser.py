"""The web page in a real browser (Debian's Chromium, driven by Playwright): sign in with a
token, reserve from the board, follow a release made by another client live (no reload),
see the camera on a device page; a phone's width in dark mode, in the trust mode of ``up``.
Screenshots are kept in ``test-artifacts/``."""
import json
import time

import pytest

from test_browser import screenshot
from test_end_to_end import run_cli, wait_state
from test_flash import flashable
from test_video import gated_lab, with_camera  # noqa: F401  (a lab with tokens, its board with a camera)

pytestmark = pytest.mark.timeout(120)
WIDE, PHONE = {"width": 1366, "height": 768}, {"width": 390, "height": 844}
ROW = 'tr[data-name="{}"][data-state="{}"]'


def open_board(browser, url: str, **options):
    page = browser.new_context(**options).new_page()  # a context of its own: its tabs share its cookies
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url)
    page.wait_for_selector("#live.on", timeout=10_000)  # the event stream is connected
    return page, errors


def fits(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


# Each character's box, read by the browser: a character lower than the one before it
# starts a new line. Ids and commands may start one only after a space, URLs only after a
# "/" or before an "&".
LINE_BREAKS = """(scope) => {
  const bad = [];
  for (const element of document.querySelectorAll(`${scope} h3 small, ${scope} code, ${scope} .endpoints a`)) {
    const chars = [];
    const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
      for (let i = 0; i < walker.currentNode.length; i++) chars.push([walker.currentNode, i]);
    }
    const text = chars.map(([node, i]) => node.data[i]).join("");
    const url = element.matches("a");
    let top = null;
    chars.forEach(([node, i], k) => {
      const range = document.createRange();
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      const box = range.getClientRects()[0];
      if (!box || text[k] === " ") return;
      const fine = url ? text[k - 1] === "/" || text[k] === "&" : text[k - 1] === " ";
      if (top !== null && box.top > top + 2 && !fine) bad.push(text.slice(0, k) + "|" + text.slice(k));
      top = box.top;
    });
  }
  return bad;
}"""


def mid_token_breaks(page, scope: str = "#mine") -> list[str]:
    """Where a lease's id, a command or a URL in ``scope`` wraps inside a token, as ``before|after``."""
    return page.evaluate(LINE_BREAKS, scope)


def test_signed_in_the_board_reserves_and_follows_a_release_made_elsewhere(gated_lab, browser):
    coordinator, alice = gated_lab
    board, errors = open_board(browser, f"{coordinator.url}/", viewport=WIDE)
    assert board.locator("button.reserve").first.is_hidden(), "nobody signed in: nothing to reserve with"
    board.fill("input[name=token]", alice["DEVICE_LOOP_TOKEN"])
    board.click("form.login button")
    board.wait_for_selector("text=Signed in as alice")
    board.wait_for_selector("#live.on")
    board.evaluate("window.sameDocument = true")

    board.click(f'{ROW.format("sim-board-0", "idle")} button.reserve')
    board.wait_for_selector(ROW.format("sim-board-0", "in_use") + ".mine", timeout=15_000)
    board.wait_for_selector('#mine [data-device="sim-board-0"] .commands', timeout=10_000)
    assert "device-loop forward lease-" in board.inner_text("#mine"), "the lease's commands, to copy"
    assert fits(board), "1366x768: nothing sticks out"
    assert mid_token_breaks(board) == []
    screenshot(board, "web-board")

    device = board.context.new_page()  # a second tab, signed in too
    device.goto(f"{coordinator.url}/devices/sim-board-0")
    device.wait_for_function("() => { const i = document.querySelector('img.camera');"
                             " return i && i.naturalWidth === 320; }", timeout=20_000)
    device.wait_for_timeout(500)
    shot = screenshot(device, "web-device")
    box = device.locator("img.camera").bounding_box()
    picture = shot[int(box["y"]):int(box["y"] + box["height"]), int(box["x"]):int(box["x"] + box["width"])]
    assert picture.std() > 10, "a frame of the camera is on the device page"
    assert "reserved (30m)" in device.inner_text("#details"), "its last state changes"

    run_cli(alice, coordinator.url, "release", "sim-board-0")  # another client gives it back
    released = time.monotonic()
    board.wait_for_selector(f'{ROW.format("sim-board-0", "reclaiming")}, {ROW.format("sim-board-0", "idle")}',
                            timeout=5_000)
    assert time.monotonic() - released < 1.0, "the board shows it within a second"
    board.wait_for_selector('#mine [data-device="sim-board-0"]', state="detached", timeout=5_000)
    board.wait_for_selector(ROW.format("sim-board-0", "idle"), timeout=15_000)
    assert board.evaluate("window.sameDocument") is True, "live, not reloaded"
    device.wait_for_selector("img.camera", state="detached", timeout=5_000)
    assert errors == []


def test_in_the_trust_mode_a_phone_reserves_a_screen_in_the_dark(env, coordinator, exporter_factory, vnc_server,
                                                                   browser):
    port, _ = vnc_server
    exporter_factory([{"name": "desk", "class": "vm", "plugin": "vnc", "upstream": f"127.0.0.1:{port}"},
                      {"name": "sim-board-0", "class": "sim-board", "plugin": "sim", "tags": ["bench-3"]}])
    wait_state(coordinator, "desk", "idle")
    board, errors = open_board(browser, f"{coordinator.url}/", viewport=PHONE, color_scheme="dark")
    assert "Single-user trust mode" in board.inner_text("header")
    assert board.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(21, 23, 26)", "dark"
    board.click(f'{ROW.format("desk", "idle")} button.reserve')
    board.wait_for_selector(ROW.format("desk", "in_use") + ".mine", timeout=15_000)
    board.wait_for_selector('#mine [data-device="desk"] .links a', timeout=10_000)
    assert fits(board), "a phone's width: nothing sticks out"
    assert mid_token_breaks(board) == []
    screenshot(board, "web-board-phone-dark")

    board.click('#mine [data-device="desk"] h3 a')
    board.wait_for_selector("#live.on")
    owner = board.locator('meta[name="device-loop-user"]').get_attribute("content")
    viewer = json.loads(run_cli({**env, "DEVICE_LOOP_USER": owner}, coordinator.url, "vnc", "desk", "--json").stdout)
    assert board.get_attribute("text=Open screen", "href") == viewer["browser"], "the noVNC viewer of the lease"
    assert fits(board)
    assert board.goto(f"{coordinator.url}/devices/nope").status == 404
    board.wait_for_timeout(300)  # its script ran
    assert errors == []


def test_a_device_page_shows_what_the_board_has_and_release_asks_first(tmp_path, coordinator, exporter_factory,
                                                                         browser):
    target = tmp_path / "sim-board-1.img"
    target.write_bytes(b"factory")
    exporter_factory([with_camera("sim-board-0"), flashable("sim-board-1", target=str(target))])
    wait_state(coordinator, "sim-board-1", "idle")
    page, errors = open_board(browser, f"{coordinator.url}/devices/sim-board-1", viewport=PHONE)
    assert page.locator("h2", has_text="Known-good image").count() == 1, "a board with a flash target"

    page.goto(f"{coordinator.url}/devices/sim-board-0")
    page.wait_for_selector("#live.on")
    assert page.locator("h2", has_text="Known-good image").count() == 0, "no flash target: nothing to recover with"
    assert page.locator("h2", has_text="Flashes").count() == 0
    assert page.locator(".terminal").is_visible()
    page.click(f'{ROW.format("sim-board-0", "idle")} button.reserve')
    page.wait_for_selector('#mine [data-device="sim-board-0"] .commands', timeout=15_000)
    assert page.locator(".terminal").count() == 0, "no 'reserve' hint while the board is yours"
    page.wait_for_function("() => { const i = document.querySelector('img.camera'); return i && i.naturalWidth; }",
                           timeout=20_000)
    assert fits(page), "a phone's width: nothing sticks out"
    assert mid_token_breaks(page) == []
    screenshot(page, "web-device-phone")

    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    page.click('#mine [data-act="release"]')  # returns once the dialog is answered
    assert asked == ["Release sim-board-0? Its endpoints close, and anyone may reserve it then."]
    page.wait_for_function("() => document.querySelector('#mine [data-act=release]')?.disabled === false")
    assert coordinator.api("/devices/sim-board-0").json()["holder"], "cancelled: still held"
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    page.click('#mine [data-act="release"]')
    page.wait_for_selector('#mine [data-device="sim-board-0"]', state="detached", timeout=10_000)
    page.wait_for_selector(".terminal", timeout=5_000)
    assert len(asked) == 2 and coordinator.api("/devices/sim-board-0").json()["holder"] is None
    assert errors == []
