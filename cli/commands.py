"""The client commands of ``device-loop``: ls, hosts, reserve, release, renew, status, log."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import functools
import os
import sys
import threading
import time
import uuid

import click

from device_loop.core import LEASE_PREFIX, LIVE_LEASE_STATES
from device_loop.core.durations import KEEPALIVE_RANGE, keepalive_problem, parse_duration
from device_loop.core.needs import FIDELITY_DETAIL, fidelity_text
from device_loop.core.vocabulary import LAB_FAILURE_STATUS, Needs, TicketState

from device_loop.client.give_back import give_back
from device_loop.client.http import CoordinatorError
from device_loop.client.interrupt import not_interrupted, sigterm_as_ctrl_c
from device_loop.client.lab import Lab, Lease, LeaseFailed, Ticket, follow_op, telling_place
from device_loop.core.errors import ErrorCode
from .output import (emit, fail, lease_text, table, terminal_width, ticket_text, tickets_text, time_left,
                     whoami_text)

if TYPE_CHECKING:  # (a type only: --help loads no pydantic)
    from device_loop.core.answers import LogEntry

json_option = click.option("--json", "as_json", is_flag=True, help="print JSON only (errors too)")


def _ttl(ctx, param, value):
    if value is None:
        return None
    if value.strip().replace(".", "", 1).isdigit():  # 30 minutes, or 30 seconds? say it
        raise click.BadParameter(f"give a unit: {value.strip()}s, {value.strip()}m, {value.strip()}h or "
                                 f"{value.strip()}d")
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _tags(ctx, param, value):
    return [t.strip() for t in (value or "").split(",") if t.strip()]


def coordinator_url(ctx, param, value):
    """``--coordinator``: a URL, not a bare address (which would fail later, obscurely)."""
    if value and not value.startswith(("http://", "https://")):
        raise click.BadParameter(f"{value!r} is not a URL; did you mean http://{value} ?")
    return value


def _said_on_the_command_line(ctx: click.Context, name: str) -> bool:
    """Was the option ``name`` typed (not an argument of that name, as ``admin token create USER``)?"""
    current: click.Context | None = ctx
    while current is not None:
        is_option = any(isinstance(p, click.Option) and p.name == name for p in current.command.params)
        if is_option and current.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            return True
        current = current.parent
    return False


def _given(ctx: click.Context, name: str, value):
    """An option of the command itself, if typed there (its environment variable is the
    group's too, and a value typed before the command name must win over it)."""
    return value if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE else None


def lab_command(func):
    """Give the command a ``Lab`` and turn coordinator refusals into exit code 1.

    ``--coordinator`` and ``--user`` work after the command name as well as before it.
    """

    @click.option("--coordinator", envvar="DEVICE_LOOP_COORDINATOR", callback=coordinator_url, help="coordinator URL")
    @click.option("--user", envvar="DEVICE_LOOP_USER", help="who you are to the lab (without tokens only)")
    @functools.wraps(func)
    @click.pass_context
    def wrapper(ctx, *args, coordinator=None, user=None, as_json=False, **kwargs):
        lab = None
        try:
            lab = Lab(_given(ctx, "coordinator", coordinator) or ctx.obj["coordinator"],
                      _given(ctx, "user", user) or ctx.obj["user"])
            if "Authorization" in lab.api.headers and _said_on_the_command_line(ctx, "user"):
                click.echo("device-loop: note: --user counts only in a lab without tokens; "
                           "this one knows you by your token", err=True)
            return func(lab, *args, as_json=as_json, **kwargs)
        except CoordinatorError as exc:
            fail(as_json, exc.code, exc.message)
        finally:
            if lab is not None:
                lab.api.close()

    return wrapper


def _my_lease(lab: Lab, target: str, ended_too: bool = False) -> Lease:
    """A lease id, or the caller's live lease on a device name (``ended_too``: else their
    last one there, to say how it ended)."""
    if target.startswith(LEASE_PREFIX):
        return lab.lease(target)
    leases = lab.my_leases(device=target)
    if leases and (ended_too or leases[0].state in LIVE_LEASE_STATES):
        return leases[0]
    device = lab.api.get(f"/devices/{target}")  # an unknown device says so
    if device["holder"]:  # not this caller's, or it would have been found
        raise CoordinatorError(ErrorCode.NOT_YOURS, f"{target} is held by {device['holder']} until "
                                                    f"{device['expires_at']}")
    if leases:
        ended = leases[0].data
        raise CoordinatorError(ErrorCode.LEASE_ENDED, f"your last lease on {target}, {ended['id']}, is "
                                                      f"{ended['state']} ({ended['reason']}, at {ended['ended_at']})")
    raise CoordinatorError(ErrorCode.NO_LEASE, f"you hold no lease on {target!r}")


# a state longer than this (a fault's whole reason) is said under `ls`'s table, not in it,
# so that its lines stay within LS_COLUMNS
MAX_STATE_CELL = 30
LS_COLUMNS = 100


def _state(device: dict) -> str:
    why_faulty = [device.get("reason") or device.get("health_reason") or "no reason given"] \
        if device["state"] == "faulty" else []
    if device["state"] == "reclaiming" and device.get("step"):
        why_faulty = [device["reason"]]
    if device["state"] != "faulty" and device.get("switched_off"):  # (its holder did it, and may hold it still)
        why_faulty.append("switched off")
    if device["state"] != "faulty" and device.get("quarantine"):  # (in use: faulty once its lease ends)
        why_faulty.append("quarantined")
    marks = (why_faulty + ["flashing"] * bool(device.get("flashing"))
             + ["needs recovery"] * bool(device.get("needs_recovery"))
             + [f"also claimed by {host}" for host in device.get("conflict_hosts", [])[1:]])
    return device["state"] + (f" ({', '.join(marks)})" if marks else "")


def _fidelity(device: dict) -> str:
    """``emulated (TCG)``: what the device is, and how where its plugin says (``fidelity.detail``)."""
    return fidelity_text(device.get("fidelity") or "-", (device.get("facts") or {}).get(FIDELITY_DETAIL))


@click.command("ls")
@click.option("--class", "device_class", help="only devices of this class")
@click.option("--tags", callback=_tags, help="only devices with all these tags, separated by commas")
@json_option
@lab_command
def ls_command(lab: Lab, device_class: str | None, tags: list[str], as_json: bool):
    """List devices: class, what each is (hardware, simulated, virtual, emulated), state, host,
    holder and time left."""
    def text(devices):
        states = {d["name"]: _state(d) for d in devices}
        long = {name: state for name, state in states.items() if len(state) > MAX_STATE_CELL}
        rows = [[d["name"], d["class"], _fidelity(d),
                 f"{d['state']} (below)" if d["name"] in long else states[d["name"]],
                 d["host"] or "-", d["holder"] or "-", time_left(d["expires_at"]),
                 ",".join(sorted({r["kind"] for r in d["resources"]}))]
                for d in devices]
        if not rows:
            return "no devices yet"
        import textwrap  # (here: a short listing needs none of it)

        below = [textwrap.fill(f"{name}: {state}", width=LS_COLUMNS, subsequent_indent="    ")
                 for name, state in long.items()]
        return "\n".join([table(["NAME", "CLASS", "FIDELITY", "STATE", "HOST", "HOLDER", "LEFT", "RESOURCES"], rows),
                          *below])
    emit(as_json, lab.devices(device_class=device_class, tags=tags), text)


@click.command("hosts")
@json_option
@lab_command
def hosts_command(lab: Lab, as_json: bool):
    """List exporters: versions, plugins, heartbeat age."""
    def text(hosts):
        rows = [[h["name"], ("online" if h["online"] else "OFFLINE") + (", draining" if h.get("draining") else "")
                 + (", connection lost" if h["online"] and h.get("link_lost") else ""),
                 h["version"], f"p{h['protocol']}",
                 f"{h['heartbeat_age_s']:.0f}s ago", ",".join(h["plugins"]["loaded"]) or "-",
                 ",".join(s["name"] for s in h["plugins"]["skipped"]) or "-", str(len(h["devices"]))]
                for h in hosts]
        out = table(["HOST", "STATUS", "VERSION", "PROTO", "HEARTBEAT", "LOADED", "SKIPPED", "DEVICES"], rows)
        if not rows:
            return "no exporter has reported yet"
        skipped = [f"  {h['name']}: {s['name']}: {s['reason']}" for h in hosts
                   for s in h["plugins"]["skipped"] + h["plugins"].get("failing", [])]
        unserved = [f"  {h['name']}: {u['device']}: {u['reason']}"
                    for h in hosts for u in h["plugins"].get("unserved", [])]
        claims = [f"  {h['name']}: {name} (owned and served by another host; fix this host's config)"
                  for h in hosts for name in h.get("claims", [])]
        steps = [f"  {h['name']}: " + "; ".join(
                     f"{plugin}: {', '.join(s['step'] for s in h['plugins']['steps'] if s['plugin'] == plugin)}"
                     for plugin in dict.fromkeys(s["plugin"] for s in h["plugins"]["steps"]))
                 for h in hosts if h["plugins"].get("steps")]
        dropped = [f"  {h['name']}: {m['plugin']}: {m['dropped']}" for h in hosts
                   for m in h["plugins"].get("metrics", []) if m.get("dropped")]
        for title, lines in (("skipped or failing plugins", skipped), ("plugin metrics left out", dropped),
                             ("configured devices not served", unserved),
                             ("devices also reported by a host that does not own them", claims),
                             ("steps between leases each host can run", steps)):
            if lines:
                out += f"\n{title}:\n" + "\n".join(lines)
        return out
    emit(as_json, lab.hosts(), text)


def target_options(command):
    """DEVICE, ``--class``, ``--tags`` and ``--needs``: which device to lease, as ``reserve``
    and ``with`` both take it (docs/architecture.md, "A lease bound to a command")."""
    for option in reversed((
            click.argument("device", required=False),
            click.option("--class", "device_class", help="any free device of this class (the one idle the longest)"),
            click.option("--tags", callback=_tags, help="any free device with all these tags, separated by commas"),
            click.option("--needs", type=click.Choice([n.value for n in Needs]),
                         help="what it may run on: real-hw (a board, or a simulated one), any (a virtual machine or "
                              "an emulator first)  [default: whatever it is]"))):
        command = option(command)
    return command


@click.command("reserve")
@target_options
@click.option("--fallback", type=click.Choice([Needs.REAL_HW.value]),
              help="with --needs any --queue: a real device once the ticket waited --fallback-after")
@click.option("--fallback-after", callback=_ttl, help="with --fallback: how long to wait for a virtual device first  "
                                                      "[default: 60s]")
@click.option("--queue", is_flag=True, help="nothing that matches is free: take a queue ticket instead of a refusal")
@click.option("--ttl", callback=_ttl, help="90s, 30m, 2h, 1d (from the grant)  [default: the lab's, 30m unless its "
                                            "coordinator's --default-ttl says]")
@click.option("--keepalive", callback=_ttl,
              help=f"hold the lease only while this command runs ({KEEPALIVE_RANGE}, e.g. 30s): it waits until the "
                   "lease is ready, prints it, keeps it alive, and releases it on Ctrl-C, SIGTERM, SIGHUP or the end "
                   "of its input (exit 0; 75 if the lab ended it meanwhile). Killed outright, the device is free "
                   "within the keepalive. A --queue ticket lapses likewise. Without --ttl it lasts up to the lab's "
                   "maximum")
@click.option("--image", metavar="IMAGE", help="with --class, --tags or --needs: a free device already running this "
                                               "registry image (its last flash wrote it and read it back) first")
@click.option("--wait", is_flag=True, help="return once the endpoints are up (with --queue: once granted, too)")
@click.option("--timeout", callback=_ttl, help="how long --wait (or --keepalive) waits  [default: 60s; with --queue: "
                                               "no limit]")
@json_option
@lab_command
def reserve_command(lab: Lab, device: str | None, device_class: str | None, tags: list[str], needs: str | None,
                    fallback: str | None, fallback_after: float | None, queue: bool, ttl: float | None,
                    keepalive: float | None, image: str | None, wait: bool, timeout: float | None, as_json: bool):
    """Reserve DEVICE, or any free device of --class and/or with --tags (or, with --needs,
    any device it takes). Answers at once (pending, or with --queue a ticket) unless --wait
    or --keepalive."""
    if timeout is not None and not (wait or keepalive):
        raise click.UsageError("--timeout is how long --wait waits: give --wait too")
    if keepalive is not None and (problem := keepalive_problem(keepalive)):
        raise click.UsageError(f"--keepalive: {problem}")
    if device is None and device_class is None and not tags and needs is None:
        raise click.UsageError("name a DEVICE, or give --class and/or --tags (or --needs)")
    if device is not None and (device_class is not None or tags):
        raise click.UsageError("name a DEVICE, or give --class and/or --tags, not both")
    if fallback is not None and needs != Needs.ANY:
        raise click.UsageError("--fallback goes with --needs any (a virtual device first, then a real one)")
    if fallback_after is not None and fallback is None:
        raise click.UsageError("--fallback-after goes with --fallback real-hw")
    started = time.monotonic()
    got = _reserved(lab, as_json, device, ttl, class_=device_class, tags=tags, queue=queue, needs=needs,
                    fallback=fallback, fallback_after=fallback_after, keepalive=keepalive, image=image)
    if keepalive is not None:
        _hold(got, timeout, started, as_json)
        return
    if not wait:
        emit(as_json, got.data, ticket_text if isinstance(got, Ticket) else lease_text)
        return
    emit(as_json, _follow(got, timeout, started, as_json, give_up=True).data, lease_text)


def _hold(got: Lease | Ticket, timeout: float | None, started: float, as_json: bool) -> None:
    """``reserve --keepalive``: the lease once ready (a ticket followed to it), printed, kept
    alive until Ctrl-C, SIGTERM, SIGHUP or the end of standard input, then released (exit
    0); the lab ending it meanwhile is a lab failure (exit 75, with the reason). A client that
    holds a lease only while it runs: killed outright, its device is free within the keepalive
    (docs/architecture.md, "Leases that live as long as their client")."""
    ended = threading.Event()
    with sigterm_as_ctrl_c():  # (from here on: a signal before the wait below is as good as one during it)
        lease = _follow(got, timeout, started, as_json, give_up=True, on_lost=lambda reason: ended.set())
        try:
            emit(as_json, lease.data, lease_text)
            if not as_json:
                click.echo(f"held while this runs: Ctrl-C, SIGTERM, SIGHUP or the end of its input releases "
                           f"{lease.id}", err=True)
            sys.stdout.flush()
            threading.Thread(target=_until_end_of_input, args=(ended,), name="stdin", daemon=True).start()
            ended.wait()
        except KeyboardInterrupt:
            pass
    with not_interrupted():
        lost = lease.lost
        try:
            lease.release()
        except CoordinatorError as exc:
            if not lost:
                fail(as_json, exc.code, f"could not release {lease.id}: {exc.message}")
    if lost:
        fail(as_json, ErrorCode.LEASE_ENDED, f"lab failure: {lost}", LAB_FAILURE_STATUS, lease=lease.id)
    click.echo(f"{lease.id} on {lease.device} released", err=True)


def _until_end_of_input(ended: threading.Event) -> None:
    """Read standard input (and drop it) until its end, then set ``ended``: the caller that
    started this command through a pipe has gone, or closed it to say it is done."""
    try:
        while os.read(0, 65536):
            pass
    except OSError:  # (no standard input at all: as good as its end)
        pass
    ended.set()


def _reserved(lab: Lab, as_json: bool, *args, **kwargs) -> Lease | Ticket:
    """``lab.reserve(*args, **kwargs)``. Ctrl-C or SIGTERM before its answer came: the same
    request again, with its Idempotency-Key (which answers what the first made, or makes it
    now), and that given back, so that nothing is left reserved that nobody knows of."""
    key = uuid.uuid4().hex
    with sigterm_as_ctrl_c() as stopped:
        try:
            return lab.reserve(*args, idempotency_key=key, **kwargs)
        except KeyboardInterrupt:
            with not_interrupted():
                lab.api.close()  # (the interrupted request's answer may be half read: a new connection)
                try:
                    got = lab.reserve(*args, idempotency_key=key, **kwargs)
                except CoordinatorError as exc:
                    said = f"nothing was reserved: {exc.message}"
                else:
                    held = (got, None) if isinstance(got, Ticket) else (None, got)
                    said = give_back(got.api, *held).said
            if not as_json and stopped.at_terminal:
                click.echo(file=sys.stderr)  # (off the line ^C was echoed on)
            fail(as_json, ErrorCode.INTERRUPTED, f"interrupted: {said}", stopped.exit_code)


def _follow(got: Lease | Ticket, timeout: float | None, started: float, as_json: bool, give_up: bool,
            on_lost: Callable[[str], object] | None = None) -> Lease:
    """``--wait``: a ticket to its lease, then the lease until its endpoints are up (``timeout``
    from ``started`` for both; a lease alone waits 60 s without one). Ctrl-C, SIGTERM or SIGHUP
    meanwhile ends the command (exit 130, 143 or 129); with ``give_up`` it first gives back what
    it waited for: the ticket is cancelled (a grant not yet claimed gives its lease back), a
    lease it made or claimed is released. Nothing waits on for nobody. A keepalive lease is kept
    alive from the moment it is had (``on_lost`` told if the lab ends it)."""
    ticket, lease = (got, None) if isinstance(got, Ticket) else (None, got)
    with sigterm_as_ctrl_c() as stopped:
        try:
            if ticket is not None:
                try:
                    lease = ticket.wait(timeout, on_change=None if as_json else telling_place(_to_stderr))
                except CoordinatorError as exc:  # (TicketEnded among them; a timeout keeps it waiting)
                    fail(as_json, exc.code, exc.message, ticket=ticket.id)
            assert lease is not None
            if lease.data.get("keepalive_s"):
                lease.kept_alive(on_lost)
            left = None if timeout is None else max(1.0, timeout - (time.monotonic() - started))
            try:
                lease.wait_ready(60 if left is None else left)
            except LeaseFailed as exc:
                kept = f"; the lease is kept: device-loop release {lease.id}" if exc.code == ErrorCode.TIMEOUT else ""
                if lease.keeper is not None:  # (kept alive by nobody once this command ends: given back now)
                    with not_interrupted():
                        kept = "; " + give_back(lease.api, None, lease).said
                fail(as_json, exc.code, exc.message + kept, lease=lease.id)
        except KeyboardInterrupt:
            with not_interrupted():
                said = give_back(got.api, ticket, lease).said if give_up else _still_yours(ticket, lease)
            if not as_json and stopped.at_terminal:
                click.echo(file=sys.stderr)  # (off the line ^C was echoed on)
            fail(as_json, ErrorCode.INTERRUPTED, f"interrupted: {said}", stopped.exit_code)
    return lease


def _still_yours(ticket: Ticket | None, lease: Lease | None) -> str:
    """What an interrupted wait leaves as it was, in words."""
    if lease is not None:
        return f"no longer waiting for {lease.id}; it is yours until you release it: device-loop release {lease.id}"
    assert ticket is not None
    return f"no longer following {ticket.id}"


def _to_stderr(text: str) -> None:
    click.echo(text, err=True)


@click.command("ticket")
@click.argument("ticket_id", metavar="TICKET")
@click.option("--claim", is_flag=True, help="claim it now if it is granted (its lease is then yours), keep a "
                                            "waiting keepalive ticket; without it, reading changes nothing")
@click.option("--wait", is_flag=True, help="follow it to its lease (claiming it), and that lease until its endpoints "
                                           "are up (Ctrl-C then cancels a ticket that still waits); a keepalive "
                                           "ticket's lease is then held as reserve --keepalive holds one")
@click.option("--timeout", callback=_ttl, help="how long --wait waits  [default: no limit]")
@json_option
@lab_command
def ticket_command(lab: Lab, ticket_id: str, claim: bool, wait: bool, timeout: float | None, as_json: bool):
    """One of your queue tickets: where it stands, its lease once granted. Reading it changes
    nothing: --claim (or --wait) claims a granted one, and its lease is yours from then on."""
    if timeout is not None and not wait:
        raise click.UsageError("--timeout is how long --wait waits: give --wait too")
    started = time.monotonic()
    ticket = lab.ticket(ticket_id)
    if not wait:
        emit(as_json, (ticket.claim() if claim else ticket).data, ticket_text)
        return
    if ticket.data.get("keepalive_s"):  # its lease lives while a client keeps it alive: this one, as reserve's
        _hold(ticket, timeout, started, as_json)
        return
    # a ticket that still waits is this command's to give up; a lease already claimed is not
    emit(as_json, _follow(ticket, timeout, started, as_json, give_up=ticket.state == TicketState.WAITING).data,
         lease_text)


@click.command("tickets")
@click.option("--all", "everyone", is_flag=True, help="everyone's (admins)")
@json_option
@lab_command
def tickets_command(lab: Lab, everyone: bool, as_json: bool):
    """Your queue tickets: what each waits for, its place, its lease once granted."""
    emit(as_json, [t.data for t in lab.tickets(everyone)], tickets_text)


@click.command("cancel")
@click.argument("ticket")
@json_option
@lab_command
def cancel_command(lab: Lab, ticket: str, as_json: bool):
    """Cancel a queue ticket (a granted one not yet claimed gives its lease back)."""
    emit(as_json, lab.ticket(ticket).cancel().data, ticket_text)


@click.command("settle")
@click.argument("target", metavar="LEASE|DEVICE")
@click.option("--timeout", callback=_ttl, help="give up waiting after this long (it goes on)")
@json_option
@lab_command
def settle_command(lab: Lab, target: str, timeout: float | None, as_json: bool):
    """Run the device's cool-down steps now, inside your lease; returns when they are done."""
    def said(op):
        detail = op["progress"].get("detail")
        if detail and not as_json:
            click.echo(f"{op['id']}: {detail}", err=True)
    lease = _my_lease(lab, target)
    op = follow_op(lab.api, lab.api.post(f"/leases/{lease.id}/settle"), on_progress=said, timeout=timeout)
    if op["state"] == "failed":
        fail(as_json, ErrorCode.SETTLE_FAILED, f"{op['id']}: {op['message']}")
    emit(as_json, op, lambda o: f"{lease.data['device']}: settle {o['state']}: {o['message']}")


@click.command("release")
@click.argument("target", metavar="LEASE|DEVICE")
@json_option
@lab_command
def release_command(lab: Lab, target: str, as_json: bool):
    """Release a lease (or your lease on a device). A board you switched off is given back
    switched off: it is faulty until somebody switches it on, which it says."""
    lease = _my_lease(lab, target)
    off = lease.data.get("switched_off")
    released = lease.release().data
    if off and not as_json:
        click.echo(f"device-loop: {lease.device} is given back switched off, and is faulty until it is switched "
                   f"on ({off})", err=True)
    emit(as_json, released, lease_text)


@click.command("renew")
@click.argument("target", metavar="LEASE|DEVICE")
@click.option("--ttl", required=True, callback=_ttl, help="new time left, from now (e.g. 2h)")
@json_option
@lab_command
def renew_command(lab: Lab, target: str, ttl: float, as_json: bool):
    """Extend a lease: it then expires TTL from now."""
    emit(as_json, _my_lease(lab, target).renew(ttl).data, lease_text)


@click.command("status")
@click.argument("target", metavar="[LEASE|DEVICE]", required=False)
@json_option
@lab_command
def status_command(lab: Lab, target: str | None, as_json: bool):
    """Show a lease with its endpoints; without an argument, all of yours."""
    if target:
        emit(as_json, _my_lease(lab, target, ended_too=True).data, lease_text)
    else:
        leases = [lease.data for lease in lab.my_leases()]
        emit(as_json, leases, lambda ls: "\n".join(map(lease_text, ls)) or "you hold no lease")


def change_words(entry: LogEntry) -> str:
    """``idle -> faulty``; a line that changed no state (a quarantine's probe) only its state."""
    return entry["to"] if entry["from"] == entry["to"] else f"{entry['from']} -> {entry['to']}"


@click.command("log")
@click.argument("device")
@json_option
@lab_command
def log_command(lab: Lab, device: str, as_json: bool):
    """A device's last 20 state changes: time, change, who, and its cause (a change to faulty
    says why). On a terminal a long cause wraps to its width; --json has each one whole."""
    def text(entries):
        return table(["TIME", "CHANGE", "BY", "CAUSE"],
                     [[e["at"], change_words(e), e["actor"], e["cause"]] for e in entries], terminal_width())
    emit(as_json, lab.log(device), text)


@click.command("whoami")
@json_option
@lab_command
def whoami_command(lab: Lab, as_json: bool):
    """Who the lab takes you for: your kind, priority band and scope, and your token's budget left."""
    emit(as_json, lab.whoami(), whoami_text)


COMMANDS = [ls_command, hosts_command, reserve_command, release_command, renew_command, status_command, log_command,
            tickets_command, ticket_command, cancel_command, settle_command, whoami_command]
