"""The web page in a real browser (Debian's Chromium, driven by Playwright): sign in with a
token, reserve from the board, follow a release made by another client live (no reload),
see the camera on a device page; a phone's width in dark mode, in the trust mode of ``up``;
queue for a class and get its device's lease once it is reclaimed, live.
Screenshots are kept in ``test-artifacts/``."""
import json
import re
import subprocess
import sys

import httpx2
import pytest

from conftest import Coordinator
from device_loop.client import Lab
from lab_in_process import FakeExporter, device
from test_browser import screenshot
from helpers import run_cli, wait_state
from test_flash import flashable, image_file
from test_video import gated_lab, with_camera  # noqa: F401  (a lab with tokens, its board with a camera)

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]
WIDE, PHONE = {"width": 1366, "height": 768}, {"width": 390, "height": 844}
ROW = 'tr[data-name="{}"][data-state="{}"]'


def open_board(browser, url: str, **options):
    page = browser.new_context(**options).new_page()  # a context of its own: its tabs share its cookies
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url)
    page.wait_for_selector("#live.on")  # the event stream is connected
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
    board.wait_for_selector(ROW.format("sim-board-0", "in_use") + ".mine")
    board.wait_for_selector('#mine [data-device="sim-board-0"] .commands')
    assert "device-loop forward lease-" in board.inner_text("#mine"), "the lease's commands, to copy"
    assert fits(board), "1366x768: nothing sticks out"
    assert mid_token_breaks(board) == []
    screenshot(board, "web-board")

    device = board.context.new_page()  # a second tab, signed in too
    device.goto(f"{coordinator.url}/devices/sim-board-0")
    device.wait_for_function("() => { const i = document.querySelector('img.camera');"
                             " return i && i.naturalWidth === 320; }")
    device.wait_for_timeout(500)
    shot = screenshot(device, "web-device")
    box = device.locator("img.camera").bounding_box()
    picture = shot[int(box["y"]):int(box["y"] + box["height"]), int(box["x"]):int(box["x"] + box["width"])]
    assert picture.std() > 10, "a frame of the camera is on the device page"
    assert "reserved (30m)" in device.inner_text("#details"), "its last state changes"

    run_cli(alice, coordinator.url, "release", "sim-board-0")  # another client gives it back
    # the board shows it, pushed (how soon: bench/live_feed.py)
    board.wait_for_selector(f'{ROW.format("sim-board-0", "reclaiming")}, {ROW.format("sim-board-0", "idle")}')
    board.wait_for_selector('#mine [data-device="sim-board-0"]', state="detached")
    board.wait_for_selector(ROW.format("sim-board-0", "idle"))
    assert board.evaluate("window.sameDocument") is True, "live, not reloaded"
    device.wait_for_selector("img.camera", state="detached")
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
    board.wait_for_selector(ROW.format("desk", "in_use") + ".mine")
    board.wait_for_selector('#mine [data-device="desk"] .links a')
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
    page.wait_for_selector('#mine [data-device="sim-board-0"] .commands')
    said = page.inner_text("#notice")  # (news: it fades after 8 s, and the lease was ready at once)
    assert "waiting for" not in said, "the lease is active: its panel says so, the news does not contradict it"
    assert re.fullmatch(r"sim-board-0 is yours until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", said), said  # ISO
    assert page.locator(".terminal").count() == 0, "no 'reserve' hint while the board is yours"
    page.wait_for_function("() => { const i = document.querySelector('img.camera'); return i && i.naturalWidth; }")
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
    page.wait_for_selector('#mine [data-device="sim-board-0"]', state="detached")
    page.wait_for_selector(".terminal")
    assert len(asked) == 2 and coordinator.api("/devices/sim-board-0").json()["holder"] is None
    assert errors == []


def api_as(coordinator: Coordinator, token: str) -> httpx2.Client:
    return httpx2.Client(base_url=f"{coordinator.url}/api/v1", timeout=10, headers={"Authorization": f"Bearer {token}"})


def test_queued_for_a_class_the_board_shows_the_lease_once_its_device_is_reclaimed(tmp_path, env, browser):
    coordinator = Coordinator(tmp_path, env, extra=())
    try:
        made = subprocess.run([sys.executable, "-m", "device_loop.cli", "--coordinator", coordinator.url, "admin",
                               "token", "create", "alice", "--admin", "--data-dir", str(tmp_path / "coord"), "--json"],
                              env=env, capture_output=True, text=True, timeout=60, check=True).stdout
        alice = api_as(coordinator, json.loads(made)["token"])  # the lab's first admin; the rest through her
        tokens = {"bob": alice.post("/admin/tokens", json={"user": "bob"}).json()["token"]}
        host = api_as(coordinator, alice.post("/admin/tokens", json={"exporter_host": "host-a"}).json()["token"])
        exporter = FakeExporter(None, "host-a")  # (its reports, sent here: no exporter runs)
        q0 = {**device("q0"), "class": "bench", "tags": ["rvv"],
              "steps": [{"step": "cooldown", "plugin": "exporter", "identifier": "sim:q0", "timeout_s": 600.0,
                         "settle": True}]}

        def beat(services=(), applied=(), operations=()) -> None:  # (a long period: silence is no outage here)
            report = exporter.report([q0], list(services), list(applied), heartbeat_s=60.0,
                                     operations=list(operations))
            assert host.post("/hosts/host-a/heartbeat", json=report).status_code == 200

        beat()
        lease = alice.post("/leases", json={"device": "q0"}).json()
        beat([{"lease": lease["id"], "device": "q0", "identifier": "sim:q0", "kind": "uart",
               "endpoints": [{"kind": "uart", "host": "127.0.0.1", "port": 4000}]}], [lease["id"]])
        assert alice.get("/devices/q0").json()["state"] == "in_use"

        board, errors = open_board(browser, f"{coordinator.url}/", viewport=WIDE)
        board.fill("input[name=token]", tokens["bob"])
        board.click("form.login button")
        board.wait_for_selector("text=Signed in as bob")
        board.wait_for_selector("#live.on")
        board.evaluate("window.sameDocument = true")
        board.click(f'{ROW.format("q0", "in_use")} button.enqueue')  # held: queue for it by name, then think again
        board.wait_for_selector('#tickets [data-ticket][data-state="waiting"]')
        assert "Your ticket for q0" in board.inner_text("#tickets")
        board.wait_for_selector('#queue tr.mine[data-requester="bob"]')
        board.click('#tickets [data-act="cancel-ticket"]')
        board.wait_for_selector("#tickets [data-ticket]", state="detached")
        board.wait_for_selector("#queue", state="hidden")

        board.fill('.reserve-any input[name="class"]', "bench")
        board.fill('.reserve-any input[name="tags"]', "rvv")
        board.click('.reserve-any button[data-act="reserve-any"]')  # "else queue" is ticked
        board.wait_for_selector('#tickets [data-ticket][data-state="waiting"]')
        assert "Number 1 in the queue (interactive)" in board.inner_text("#tickets")
        board.wait_for_selector('#queue tr.mine[data-requester="bob"]')  # the stream's, not a reload
        queued = board.inner_text("#queue")
        assert "any device of class bench with tag rvv" in queued and "interactive" in queued
        board.wait_for_selector(f'{ROW.format("q0", "in_use")} .queued:text("1 waiting")')
        ticket = board.get_attribute("#tickets [data-ticket]", "data-ticket")
        assert ticket.startswith("tk-") and ticket in board.inner_text("#tickets"), "its id, to its requester"
        screenshot(board, "web-queue")

        assert alice.post(f"/leases/{lease['id']}/release").status_code == 200
        board.wait_for_selector(ROW.format("q0", "reclaiming"))
        beat()  # the lease's services are gone: its step between leases begins
        (step,) = host.get("/hosts/host-a/desired").json()["operations"]
        progress = {"done": 0, "total": None, "unit": "", "detail": "cooling down: 51.2 °C, waiting for < 45 °C"}
        running = {"op": step["op"], "device": "q0", "kind": step["kind"], "state": "running", "phase": "running",
                   "progress": progress, "message": "", "seconds": {}, "result": None, "changed": True}
        beat(operations=[running])
        board.wait_for_selector(f'{ROW.format("q0", "reclaiming")} .why:text("step 1/1 cooldown: cooling down: '
                                '51.2 °C")')
        beat(operations=[{**running, "state": "done", "message": "44.9 °C after 31 s"}])  # reclaimed: granted

        # the grant is offered, not taken by the page: a board left open holds nothing for nobody
        board.wait_for_selector('#tickets [data-ticket][data-state="granted"] [data-act="claim-ticket"]')
        assert "q0 is held for you until" in board.inner_text("#tickets")
        board.click('#tickets [data-act="claim-ticket"]')
        board.wait_for_selector('#mine [data-device="q0"]')
        board.wait_for_selector(f'{ROW.format("q0", "allocating")}.mine, {ROW.format("q0", "in_use")}.mine')
        board.wait_for_selector("#tickets [data-ticket]", state="detached")
        board.wait_for_selector("#queue", state="hidden")
        assert board.locator('tr[data-name="q0"] .queued').count() == 0
        assert board.evaluate("window.sameDocument") is True, "live, not reloaded"
        bob = httpx2.get(f"{coordinator.url}/api/v1/leases", headers={"Authorization": f"Bearer {tokens['bob']}"},
                         timeout=10).json()
        assert [lease["device"] for lease in bob] == ["q0"]

        # the holder settles it (its cool-down step, inside the lease) and sees how far it is
        served = [{"lease": bob[0]["id"], "device": "q0", "identifier": "sim:q0", "kind": "uart",
                   "endpoints": [{"kind": "uart", "host": "127.0.0.1", "port": 4001}]}]
        beat(served, [bob[0]["id"]])
        board.click('#mine [data-device="q0"] h3 a')
        board.wait_for_selector("#live.on")
        board.click('button[data-act="settle"]')
        board.wait_for_selector('p.progress[data-op]:text("settle queued")')
        (settle,) = [op for op in host.get("/hosts/host-a/desired").json()["operations"] if op["kind"] == "settle"]
        cooling = {**running, "op": settle["op"], "kind": "settle", "progress": {**progress, "detail": "47.0 °C"}}
        beat(served, operations=[cooling])
        board.wait_for_selector('p.progress:text("settle running: 47.0 °C")')
        screenshot(board, "web-device-settle")
        beat(served, operations=[{**cooling, "progress": {**progress, "detail": "45.5 °C"}}])  # (its state the same)
        board.wait_for_selector('p.progress:text("settle running: 45.5 °C")')
        beat(served, operations=[{**cooling, "state": "done", "message": "44 °C: settled"}])
        board.wait_for_selector("#notice:text('q0: settle done: 44 °C: settled')")
        board.wait_for_selector("p.progress", state="detached")
        assert errors == []
    finally:
        coordinator.stop()


PHONE_400 = {"width": 400, "height": 800}


def test_a_device_page_keeps_its_flashes_in_sight_and_folds_away_what_an_ab_job_settled(
        tmp_path, env, coordinator, exporter_factory, browser):
    target = tmp_path / "sim-board-0.img"
    target.write_bytes(b"factory")
    exporter_factory([{**flashable("sim-board-0", target=str(target)),
                       "steps": [{"step": "cooldown", "below": "45C", "timeout": "1m"}]}])
    wait_state(coordinator, "sim-board-0", "idle")
    build, _ = image_file(tmp_path, "build", 1 << 20)
    run_cli(env, coordinator.url, "images", "upload", str(build), "--name", "build-1", "--for", "sim-board")
    lease = Lab(coordinator.url, "alice").reserve("sim-board-0").wait_ready()
    assert lease.flash("build-1").state == "done"
    for _ in range(20):  # an A/B job settles before each of its runs: the flash is older than the last 20
        assert lease.settle().state == "done"

    page, errors = open_board(browser, f"{coordinator.url}/devices/sim-board-0", viewport=PHONE_400)
    flashes = page.locator("section.flashes")
    assert flashes.count() == 1, "a section of their own"
    assert flashes.locator("h2").inner_text() == "Flashes" and "build-1" in flashes.inner_text()
    assert flashes.is_visible(), "the flashes the README promises, in sight"
    routine = page.locator("section.operations details.routine")
    assert "Settle and steps between leases: 20 of the last 20 (20 settle)" in routine.locator("summary").inner_text()
    assert not routine.evaluate("d => d.open"), "folded away"
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height < 3000, f"{height} px tall at 400 px"  # (20 settles shown whole: some 6000)
    assert fits(page)
    screenshot(page, "web-device-after-settles-400")
    routine.locator("summary").click()
    assert routine.locator("tbody tr").count() == 20, "each one, a click away"
    assert errors == []
