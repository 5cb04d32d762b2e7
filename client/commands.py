"""The client commands of ``device-loop``: ls, hosts, reserve, release, renew, status, log."""
from __future__ import annotations

import functools

import click

from device_loop.core import LEASE_PREFIX, LIVE_LEASE_STATES
from device_loop.core.durations import parse_duration

from .http import CoordinatorError
from .lab import Lab, Lease, LeaseFailed
from .output import emit, fail, lease_text, table, time_left

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
            if "Authorization" in lab.api.http.headers and _said_on_the_command_line(ctx, "user"):
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
        raise CoordinatorError("not_yours", f"{target} is held by {device['holder']} until {device['expires_at']}")
    if leases:
        ended = leases[0].data
        raise CoordinatorError("lease_ended", f"your last lease on {target}, {ended['id']}, is {ended['state']} "
                                              f"({ended['reason']}, at {ended['ended_at']})")
    raise CoordinatorError("no_lease", f"you hold no lease on {target!r}")


def _state(device: dict) -> str:
    why_faulty = [device.get("health_reason") or "no reason given"] if device["state"] == "faulty" else []
    marks = (why_faulty + ["flashing"] * bool(device.get("flashing"))
             + ["needs recovery"] * bool(device.get("needs_recovery"))
             + [f"also claimed by {host}" for host in device.get("conflict_hosts", [])[1:]])
    return device["state"] + (f" ({', '.join(marks)})" if marks else "")


@click.command("ls")
@json_option
@lab_command
def ls_command(lab: Lab, as_json: bool):
    """List devices: class, state, host, holder and time left."""
    def text(devices):
        rows = [[d["name"], d["class"], _state(d), d["host"] or "-", d["holder"] or "-",
                 time_left(d["expires_at"]), ",".join(sorted({r["kind"] for r in d["resources"]}))]
                for d in devices]
        if not rows:
            return "no devices yet"
        return table(["NAME", "CLASS", "STATE", "HOST", "HOLDER", "LEFT", "RESOURCES"], rows)
    emit(as_json, lab.devices(), text)


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
        for title, lines in (("skipped or failing plugins", skipped), ("configured devices not served", unserved),
                             ("devices also reported by a host that does not own them", claims)):
            if lines:
                out += f"\n{title}:\n" + "\n".join(lines)
        return out
    emit(as_json, lab.hosts(), text)


@click.command("reserve")
@click.argument("device")
@click.option("--ttl", default="30m", show_default=True, callback=_ttl, help="90s, 30m, 2h, 1d")
@click.option("--wait", is_flag=True, help="return once the endpoints are up")
@click.option("--timeout", callback=_ttl, help="how long --wait waits  [default: 60s]")
@json_option
@lab_command
def reserve_command(lab: Lab, device: str, ttl: float, wait: bool, timeout: float | None, as_json: bool):
    """Reserve DEVICE. Answers at once (pending) unless --wait."""
    if timeout is not None and not wait:
        raise click.UsageError("--timeout is how long --wait waits: give --wait too")
    lease = lab.reserve(device, ttl)
    if wait:
        try:
            lease.wait_ready(60 if timeout is None else timeout)
        except LeaseFailed as exc:
            kept = f"; the lease is kept: device-loop release {lease.id}" if exc.code == "timeout" else ""
            fail(as_json, exc.code, exc.message + kept, lease=lease.id)
    emit(as_json, lease.data, lease_text)


@click.command("release")
@click.argument("target", metavar="LEASE|DEVICE")
@json_option
@lab_command
def release_command(lab: Lab, target: str, as_json: bool):
    """Release a lease (or your lease on a device)."""
    emit(as_json, _my_lease(lab, target).release().data, lease_text)


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


@click.command("log")
@click.argument("device")
@json_option
@lab_command
def log_command(lab: Lab, device: str, as_json: bool):
    """A device's last 20 state changes: time, cause, actor."""
    def text(entries):
        return table(["TIME", "CHANGE", "CAUSE", "ACTOR"],
                     [[e["at"], f"{e['from']} -> {e['to']}", e["cause"], e["actor"]] for e in entries])
    emit(as_json, lab.log(device), text)


COMMANDS = [ls_command, hosts_command, reserve_command, release_command, renew_command, status_command, log_command]
