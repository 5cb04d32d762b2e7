"""The web page's routes: the board, a device's page, signing in and out, the static files.

Each reads through ``Rules`` and renders a template; who looks decides only what the page
offers (the REST routes decide what they may do). ``device_row`` renders a board row, and
``queue_row`` a row of the board's queue, for the pages and for the event stream alike.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.templating import Jinja2Templates

from device_loop.core import FLASH_KIND, LIVE_LEASE_STATES, LIVE_OP_STATES, NAME_PATTERN, POWER_KIND, SETTLE_KIND
from device_loop.core.durations import format_duration, iso
from device_loop.core.needs import FIDELITY_DETAIL, meets
from device_loop.core.usage import camera_urls, screen_url
from device_loop.core.vocabulary import NOT_FOR_TIMING, OPEN_TICKET_STATES, Needs, TicketState

from ..errors import APIError, not_found
from ..identity import ADMIN, COOKIE, USER, caller_identity, refusal, token_identity
from ..limits import FORM, takes_body
from ..openapi import answers
from ..quarantine import span
from ..who import COORDINATOR, Who
from .power_panel import power_panel

HERE = Path(__file__).parent
TEMPLATES = Jinja2Templates(directory=HERE / "templates")  # HTML is autoescaped
TEMPLATES.env.filters["iso"] = iso
TEMPLATES.env.filters["duration"] = format_duration
TEMPLATES.env.filters["span"] = span  # a quarantine's window and probe interval, as its ring log says them
TEMPLATES.env.globals["fidelity_detail"] = FIDELITY_DETAIL  # the fact that says how it is emulated: "TCG"
TEMPLATES.env.globals["not_for_timing"] = [f.value for f in NOT_FOR_TIMING]
TEMPLATES.env.globals["needs_choices"] = [n.value for n in Needs]  # the board's reserve form
# as an HTML pattern (anchored by itself; browsers read it with the v flag, where a "-" is escaped)
TEMPLATES.env.globals["name_pattern"] = NAME_PATTERN.strip("^$").replace("-]", "\\-]")
LEASE_LENGTHS_S = (1800, 3600, 7200, 14400, 86400)  # what the page offers, up to this lab's maximum
STATIC = {name: HERE / "static" / name for name in ("lab.css", "lab.js")}
COOKIE_MAX_AGE = 30 * 86400  # a cookie outliving its token is no sign-in (identity.py)
NO_STORE = {"Cache-Control": "no-store"}  # pages hold the viewer's leases and CSRF value
LAST_OPERATIONS = 20  # a device page's operations: the last this many (the power section lists its own)
SHOWN_FLASHES = 10    # ... and its last flashes, however many operations came after them


def _rows() -> Any:
    return TEMPLATES.get_template("rows.html").module  # (its macros are its attributes)


def device_row(device: Mapping[str, Any]) -> str:
    """A device's row of the board, as ``GET /api/v1/devices`` shows the device."""
    return str(_rows().device_row(device))


def queue_row(entry: Mapping[str, Any]) -> str:
    """A waiting ticket's row of the board's queue, as ``GET /api/v1/queue`` shows it to anyone."""
    return str(_rows().queue_row(entry))


def serves(device: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    """Whether ``device`` is what a ticket (or queue entry) ``want`` waits for: the device it
    names, or one of its class with all its tags, of a fidelity its needs take, a fallback's
    counted (lab.js decides it the same way)."""
    if not meets(device.get("fidelity", ""), want.get("needs"), fallen_back=bool(want.get("fallback"))):
        return False
    if want["device"] is not None:
        return want["device"] == device["name"]
    return want["device_class"] in (None, device["class"]) and set(want["tags"]) <= set(device["tags"])


@dataclass(frozen=True)
class Viewer:
    """Who looks at a page, as far as the page is concerned."""
    name: str | None  # None: nobody the page can act for
    admin: bool
    trusted: bool     # the single-user trust mode: the lab's owner, without signing in
    csrf: str         # what requests send as X-Device-Loop-CSRF ("" unless signed in by cookie)
    who: Who          # the caller, as the services take it


async def viewer_of(request: Request) -> Viewer:
    """Who looks at the page of ``request``."""
    identity = await caller_identity(request)
    person = refusal(USER, identity) is None  # (an exporter's token is nobody here)
    return Viewer(identity.name if person else None, refusal(ADMIN, identity) is None, identity.trusted,
                  identity.csrf or "", identity)


def _http_url(url: str | None) -> str | None:
    """A URL an exporter reported, if it is one a page may link to (never ``javascript:``)."""
    return url if url and url.startswith(("http://", "https://")) else None


def _shown(lease: dict) -> dict:
    """A lease with what its panel links to: its camera, its screen."""
    camera = camera_urls(lease)
    return {**lease, "screen": _http_url(screen_url(lease)),
            "camera": camera if camera and _http_url(camera["page"]) else None,  # its URLs all start so
            "endpoints": [{**e, "url": _http_url(e.get("url"))} for e in lease["endpoints"]]}


async def _my_leases(request: Request, viewer: Viewer, device: str | None = None) -> list[dict]:
    if viewer.name is None:
        return []
    leases = await request.app.state.rules.leases.mine(viewer.who, device)
    return [_shown(lease) for lease in leases if lease["state"] in LIVE_LEASE_STATES]


async def _queue(request: Request) -> list[dict]:
    """The waiting tickets as anyone sees them (no ticket ids: the event stream, which the app
    makes following them, sends the same to every viewer)."""
    rules = request.app.state.rules
    return [dict(e) for e in await rules.scheduler.queue()]


async def _my_tickets(request: Request, viewer: Viewer) -> list[dict]:
    """The viewer's open tickets, and the claimed ones whose lease lives. Reading them claims
    nothing (as no GET does): a granted one offers "Take it", which claims that one ticket
    (POST .../claim); a board left open holds nothing for somebody who left."""
    if viewer.name is None:
        return []
    tickets = await request.app.state.rules.scheduler.tickets(viewer.who, False)
    return [t for t in tickets if t["state"] in OPEN_TICKET_STATES or (
        t["state"] == TicketState.CLAIMED and t["lease"] and t["lease"]["state"] in LIVE_LEASE_STATES)]


def _not_shown(tickets: list[dict], leases: list[dict]) -> list[dict]:
    """``tickets`` but the claimed ones whose lease the page shows (their lease is all there is to see)."""
    shown = {lease["id"] for lease in leases}
    return [t for t in tickets if not (t["state"] == TicketState.CLAIMED and t["lease"]["id"] in shown)]


def _lease_lengths(request: Request) -> list[tuple[int, str, bool]]:
    """(seconds, label, selected) of the lease lengths the page offers: this lab's default
    and the usual ones up to its maximum."""
    settings = request.app.state.rules.settings
    lengths = sorted({*[s for s in LEASE_LENGTHS_S if s <= settings.max_ttl_s], int(settings.default_ttl_s)})
    return [(s, format_duration(s), s == int(settings.default_ttl_s)) for s in lengths]


def render(request: Request, template: str, viewer: Viewer, status: int = 200, **context) -> Response:
    """``template`` rendered for ``viewer``, never cached."""
    return TEMPLATES.TemplateResponse(request, template, {"viewer": viewer, "lease_lengths": _lease_lengths(request),
                                                         **context}, status_code=status, headers=NO_STORE)


@answers("text/html")
async def board(request: Request) -> Response:
    """The devices board: live over /api/v1/events."""
    rules, viewer = request.app.state.rules, await viewer_of(request)
    candidates = [c for c in await rules.devices.candidates() if not c["adopted_as"]] if viewer.admin else []
    tokens = await rules.budgets.tokens_board() if viewer.admin else []  # (docs/architecture.md, "Shares of one lab")
    tickets = await _my_tickets(request, viewer)
    mine = await _my_leases(request, viewer)
    devices = await rules.devices.list_devices()
    return render(request, "board.html", viewer, devices=devices, mine=mine, candidates=candidates, tokens=tokens,
                 tokens_ignored=request.app.state.single_user, tickets=_not_shown(tickets, mine),
                 queue=await _queue(request),
                 classes=sorted({d["class"] for d in devices}))


@answers("text/html")
async def device_page(request: Request) -> Response:
    """A device: its row, the viewer's lease on it (camera, screen), its last state changes,
    operations, power switch and known-good image."""
    rules, viewer, name = request.app.state.rules, await viewer_of(request), request.path_params["name"]
    try:
        device = await rules.devices.device_info(name, viewer.who)  # (an admin's: with its lease's id)
    except APIError as exc:
        if exc.status != 404:
            raise
        return render(request, "missing.html", viewer, 404, what="device", name=name)
    tickets = await _my_tickets(request, viewer)
    mine = await _my_leases(request, viewer, name)
    seen_as = {"who": viewer.who}  # (paths in what they said: to whom they are shown)
    operations = await rules.operations.of_device(name, LAST_OPERATIONS, **seen_as)
    listed = [op for op in operations if op["kind"] not in (FLASH_KIND, POWER_KIND)]  # (each has its section)
    # which steps settle runs too: the exporter's config says, and the device's facts keep it
    facts = await rules.devices.facts(name)
    steps = [{"step": s["step"], "settle": bool(s.get("settle"))} for s in (facts["steps"] if facts else [])]
    settle_lease = None  # the live lease the viewer may settle: theirs, or one it may act on (an admin's token)
    if any(s["settle"] for s in steps):
        settle_lease = mine[0]["id"] if mine else device.get("lease") if viewer.who.may_act_on(device["holder"]) \
            else None
    settling = next((op for op in operations if op["kind"] == SETTLE_KIND and op["state"] in LIVE_OP_STATES), None)
    return render(request, "device.html", viewer, device=device,
                 log=list(reversed(await rules.devices.device_log(name))), last_ops=LAST_OPERATIONS,
                 flashes=await rules.operations.of_device(name, SHOWN_FLASHES, FLASH_KIND, **seen_as),
                 others=[op for op in listed if not _routine(op)], routine=[op for op in listed if _routine(op)],
                 known_good=await rules.images.known_good_image(device),
                 flash_target=any(r["kind"] == FLASH_KIND for r in device["resources"]),
                 images=await rules.images.list_images(name) if viewer.admin else [],
                 mine=mine, tickets=_not_shown(tickets, mine), steps=steps, settle_lease=settle_lease,
                 settling=settling if settle_lease else None, power=await power_panel(rules, device, mine, viewer),
                 queue=[e for e in await _queue(request) if serves(device, e)],
                 classes=[device["class"]])


def _routine(op: Mapping[str, Any]) -> bool:
    """A settle or a step between leases: what the page folds away, there are so many."""
    return op["kind"] == SETTLE_KIND or op["requester"] == COORDINATOR


def _local(path: str) -> str:
    """A path on this site to go back to (never another site's URL)."""
    return path if path.startswith("/") and not path.startswith("//") and "\\" not in path else "/"


@answers("text/html")
@takes_body(media_type=FORM)
async def login(request: Request) -> Response:
    """Sign in with a token (form field ``token``): it is kept in an HttpOnly cookie."""
    form = parse_qs((await request.body()).decode(errors="replace"))
    token, back = form.get("token", [""])[0].strip(), _local(form.get("next", ["/"])[0])
    identity = await token_identity(request.app.state.rules, token) if token else None
    if identity is None or refusal(USER, identity) is not None:  # an exporter's token signs nobody in
        return RedirectResponse(f"{back}?login=failed", 303)
    response = RedirectResponse(back, 303)
    response.set_cookie(COOKIE, token, max_age=COOKIE_MAX_AGE, path="/", secure=request.url.scheme == "https",
                        httponly=True, samesite="strict")
    return response


@answers("text/html")
async def logout(request: Request) -> Response:
    """Sign out: the cookie is dropped (the token itself stays valid)."""
    response = RedirectResponse("/", 303)
    response.delete_cookie(COOKIE, path="/", secure=request.url.scheme == "https", httponly=True, samesite="strict")
    return response


@answers("text/css, text/javascript")
async def static_file(request: Request) -> Response:
    """The page's stylesheet and script."""
    path = STATIC.get(request.path_params["file"])
    if path is None:
        raise not_found("file", request.path_params["file"])
    return FileResponse(path, headers={"Cache-Control": "no-cache"})  # revalidated: an upgrade shows at once
