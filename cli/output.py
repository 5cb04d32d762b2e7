"""How the CLI prints: readable tables, or JSON only (errors included) with --json."""
from __future__ import annotations

import json
import sys
import time
from typing import NoReturn

import click

from device_loop.core import LIVE_LEASE_STATES
from device_loop.core.durations import format_duration, parse_iso, when_granted
from device_loop.core.usage import gated
from device_loop.core.vocabulary import Band, TicketState


MIN_WRAPPED = 24  # the narrowest a wrapped last column gets, however narrow the terminal


def table(headers: list[str], rows: list[list[str]], width: int | None = None) -> str:
    """``rows`` under ``headers``, each column as wide as its widest cell. With ``width``
    (a terminal's) the last column wraps to fit it, its lines under its own column."""
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows)]
    if width is None:
        lines = [headers] + rows
        return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)
    import textwrap  # (here, not at the top: with shutil, 5 ms more for every command that prints no table)

    indent = sum(widths[:-1]) + 2 * (len(widths) - 1)
    last = max(MIN_WRAPPED, width - indent)
    out = []
    for line in [headers] + rows:
        head = "  ".join(str(c).ljust(w) for c, w in zip(line[:-1], widths))
        pieces = textwrap.wrap(str(line[-1]), last, break_on_hyphens=False) or [""]
        out.append(f"{head}  {pieces[0]}".rstrip() if head else pieces[0])
        out += [" " * indent + piece for piece in pieces[1:]]
    return "\n".join(out)


def terminal_width() -> int | None:
    """The terminal's width when people read stdout there (``COLUMNS`` first); None when it
    goes to a pipe or a file, where a line stays whole."""
    if not sys.stdout.isatty():
        return None
    import shutil  # (a terminal's width only: see table)

    return shutil.get_terminal_size().columns


def time_left(expires_at: str | None) -> str:
    return format_duration(parse_iso(expires_at) - time.time()) if expires_at else "-"


def emit(as_json: bool, data, text) -> None:
    """Print ``data`` as JSON, or ``text(data)`` for people."""
    click.echo(json.dumps(data, indent=2) if as_json else text(data))


def fail(as_json: bool, code: str, message: str, exit_code: int = 1, **fields) -> NoReturn:
    """Refuse: ``{"error", "message", **fields}`` with --json (``lease`` when one is left behind)."""
    if as_json:
        click.echo(json.dumps({"error": code, "message": message, **fields}))
    else:
        click.echo(f"device-loop: {message}", err=True)
    sys.exit(exit_code)


def lease_text(lease: dict) -> str:
    head = f"{lease['id']} on {lease['device']}: {lease['state']}"
    if lease["state"] in LIVE_LEASE_STATES and lease.get("keepalive_s"):
        head += (f", kept alive (keepalive {format_duration(lease['keepalive_s'])}), ends {lease['ends_at']} at the "
                 f"latest (in {time_left(lease['ends_at'])})")
    elif lease["state"] in LIVE_LEASE_STATES:
        head += f", expires {lease['expires_at']} (in {time_left(lease['expires_at'])})"
    lines = [head]
    if lease["state"] in LIVE_LEASE_STATES and lease.get("budget_capped"):
        lines.append("  granted only to its token's budget's end, less than asked (device-loop whoami: what is left)")
    if not lease["ready"]:
        lines.append(f"  {lease['reason']}")
    if lease.get("flashing"):
        lines.append(f"  being flashed: device-loop op {lease['flashing']}")
    if lease.get("switched_off"):
        lines.append(f"  SWITCHED OFF: {lease['switched_off']}")
    if lease.get("needs_recovery"):
        lines.append(f"  NEEDS RECOVERY ({lease['needs_recovery']}): device-loop recover {lease['device']}")
    for e in lease["endpoints"]:
        where = e.get("url") or f"{e['host']}:{e['port']}"
        lines.append(f"  {e['kind']:<7} {where}" + (f"  ({e['protocol']})" if e.get("protocol") else ""))
    if gated(lease):
        lines.append(f"  gated: connect through 'device-loop forward {lease['id']}' (or use console / adb)")
    lines += [f"  $ {command}" for command in lease.get("commands", [])]
    return "\n".join(lines)


def ticket_text(ticket: dict) -> str:
    """A queue ticket for people: what it waits for and where it stands, its lease once granted."""
    band = "" if ticket.get("band", Band.NORMAL) == Band.NORMAL else f", {ticket['band']}"
    head = f"{ticket['ticket']} ({ticket['kind']}{band}) for a device {ticket['wants']}: {ticket['state']}"
    if ticket["state"] == "waiting":
        head += (f", position {ticket['position']}; follow it with 'device-loop ticket {ticket['ticket']} --wait', "
                 f"or cancel it: device-loop cancel {ticket['ticket']}")
        estimate = ticket.get("estimate")
        head += (f"\n  likely granted {when_granted(estimate)}: {estimate['basis']}" if estimate else
                 "\n  no device that could serve it is in service now (offline or faulty): no estimate")
    elif ticket["state"] == "granted":
        head += (f"; claim it by {ticket['claim_by']} (device-loop ticket {ticket['ticket']} --claim), or it passes "
                 "to the next ticket")
    elif ticket["reason"]:
        head += f" ({ticket['reason']})"
    if ticket["state"] in ("waiting", "granted") and ticket.get("keepalive_s"):
        head += f"\n  it lapses unless followed at least every {format_duration(ticket['keepalive_s'])} (keepalive)"
    lease = ticket.get("lease")
    return head + ("\n" + lease_text(lease) if lease else "")


def tickets_text(tickets: list[dict]) -> str:
    if not tickets:
        return "you have no queue tickets"
    return table(["TICKET", "WHO", "STATE", "KIND", "WANTS", "POSITION", "LIKELY", "SINCE", "LEASE"],
                 [[t["ticket"], t["requester"], t["state"], t["kind"] + ("" if t.get("band", Band.NORMAL) == Band.NORMAL
                                                                         else f" {t['band']}"),
                   t["wants"], str(t["position"] or "-"), when_granted(t["estimate"]) if t.get("estimate") else "-",
                   t["created_at"], _ticket_lease(t)] for t in tickets])


def _ticket_lease(ticket: dict) -> str:
    """A ticket's lease as its listing says it: a grant is to be taken (a listing does not take
    it), a claimed one is the holder's; an ended ticket's lease is none of theirs."""
    lease = ticket["lease"]
    if not lease or ticket["state"] not in (TicketState.GRANTED, TicketState.CLAIMED):
        return "-"
    if ticket["state"] == TicketState.GRANTED:
        by = f" by {ticket['claim_by']}" if ticket.get("claim_by") else ""
        return f"{lease['device']} held for you{by}: take it with device-loop ticket {ticket['ticket']}"
    return f"{lease['id']} on {lease['device']}"


def on_terminal(as_json: bool) -> bool:
    """Whether to draw progress: for people at a terminal, not with --json or when piped."""
    return not as_json and sys.stdout.isatty() and sys.stderr.isatty()


def progress_bar(label: str, done: int, total: int, end: bool = False) -> None:
    """Draw (over the last one) a progress bar on stderr: ``label [####....] 12/64 MiB``."""
    filled = 30 * min(done, total) // max(total, 1)
    sys.stderr.write(f"\r  {label:<10} [{'#' * filled}{'.' * (30 - filled)}] {done >> 20}/{total >> 20} MiB\033[K"
                     + ("\n" if end else ""))
    sys.stderr.flush()


def whoami_text(me: dict) -> str:
    """``device-loop whoami``: who, then a scoped token's scope and budget, one line each."""
    lines = [f"{me['name']} ({me['kind']}{', admin' if me['admin'] else ''}), band {me['band']}"]
    scope = me.get("scope")
    if scope is None:
        lines.append("unscoped")
    else:
        from device_loop.core.scopes import TokenScope, describe_scope  # (pydantic: only where a scope is shown)
        lines.append("scope: " + describe_scope(TokenScope.model_validate(scope)))
    if me.get("live_leases") is not None:
        lines.append(f"leases at once: {me['live_leases']} of {scope['max_leases'] if scope else '?'}")
    budget = me.get("budget")
    if budget is not None:
        minutes = {key: round(budget[key] / 60, 1) for key in ("used_s", "held_s", "left_s")}
        lines.append(f"{budget['words']} (used {minutes['used_s']}, held {minutes['held_s']} by live leases"
                     + (f"; period ends {budget['renews_at']}" if budget["renews_at"] else "") + ")")
    return "\n".join(lines)

