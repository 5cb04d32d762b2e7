"""``device-loop admin``: tokens. With ``--database-url`` or ``--data-dir`` it works on the
database itself, which is how the first admin token of a new lab is made; otherwise it
asks the coordinator, with an admin token."""
from __future__ import annotations

import asyncio
import getpass
import time
from pathlib import Path

import click

from device_loop.cli.commands import json_option, lab_command
from device_loop.client.http import CoordinatorError
from device_loop.cli.output import emit, lease_text, table
from device_loop.core import LEASE_PREFIX
from device_loop.core.durations import parse_duration
from device_loop.core.errors import ErrorCode
from device_loop.core.vocabulary import Band

direct_options = [
    click.option("--database-url", envvar="DEVICE_LOOP_DATABASE_URL", help="work on this database directly"),
    click.option("--data-dir", type=click.Path(path_type=Path), help="work on the SQLite database in this folder"),
]


def _direct(func):
    for option in reversed(direct_options):
        func = option(func)
    return func


async def _on_database(url: str, action):
    from device_loop.coordinator.errors import APIError
    from device_loop.coordinator.store import Store

    store = Store(url)
    await store.connect()
    try:
        return await action(store)
    except APIError as exc:
        raise click.ClickException(exc.message) from None
    finally:
        await store.disconnect()


async def _audit_direct(store, action: str, detail: dict) -> None:
    """Work done on the database itself is audited too, as the login that did it."""
    from device_loop.coordinator.rules import Rules

    await Rules(store).admin.record(f"database:{getpass.getuser()}", action, detail)


def _database_url(database_url, data_dir) -> str | None:
    if database_url:
        return database_url
    if data_dir:
        from device_loop.coordinator.serve import sqlite_url
        return sqlite_url(data_dir)
    return None


def _token_text(made: dict) -> str:
    who = f"exporter {made['host']}" if made["host"] else made["user"] + (" (admin)" if made["admin"] else "") + (
        " (an agent's: its queue tickets are batch)" if made.get("kind") == "agent" else "")
    where = ("the exporter's token_file (chmod 600)" if made["host"] else
             "~/.config/device-loop/token, e.g.: mkdir -p ~/.config/device-loop && "
             "(umask 077; cat > ~/.config/device-loop/token)")
    limits = "" if made.get("scope") is None and made.get("band", Band.NORMAL) == Band.NORMAL else (
        f"\n{_token_line(made)}")
    note = f"\nnote: {made['note']}" if made.get("note") else ""
    return f"token {made['id']} for {who}; it is shown this once:\n{made['token']}\nkeep it in {where}{limits}{note}"


def _tokens_text(rows: list[dict]) -> str:
    if not rows:
        return "no tokens"
    from device_loop.core.scopes import TokenScope, describe_budget, describe_scope

    def scope(row: dict) -> TokenScope | None:
        return None if row.get("scope") is None else TokenScope.model_validate(row["scope"])

    return table(["ID", "FOR", "KIND", "ADMIN", "BAND", "SCOPE", "BUDGET", "CREATED", "EXPIRES", "REVOKED"],
                 [[r["id"], r["host"] and f"exporter {r['host']}" or r["user"],
                   "-" if r["host"] else r.get("kind", "-"), "yes" if r["admin"] else "-",
                   "-" if r["host"] else r.get("band", Band.NORMAL), describe_scope(scope(r)),
                   describe_budget(scope(r)),
                   r["created_at"], r["expires_at"] or "-", r["revoked_at"] or "-"]
                  for r in rows])


def _token_line(row: dict) -> str:
    """A token's band, scope and budget, in the words the options take."""
    from device_loop.core.scopes import TokenScope, describe_budget, describe_scope

    scope = None if row.get("scope") is None else TokenScope.model_validate(row["scope"])
    return f"{row['id']}: band {row.get('band', 'normal')}; scope {describe_scope(scope)}; " \
           f"budget {describe_budget(scope)}"


def _scope_given(scope: tuple[str, ...], budget: str | None, lifted: tuple[str, ...] = ()) -> dict | None:
    """The scope fields the options name (None: none named), for the coordinator to judge."""
    from device_loop.core.scopes import LIMIT_FIELDS, parse_budget, parse_scope

    try:
        fields = parse_scope(scope)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--scope") from None
    if budget is not None:
        try:
            fields |= parse_budget(budget)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--budget") from None
    for key in lifted:
        fields[LIMIT_FIELDS[key]] = None
    return fields or None


def _scope_model(fields: dict | None):
    """``fields`` as a ``TokenScope`` (what the database's own path hands the coordinator's rules)."""
    if fields is None:
        return None
    from pydantic import ValidationError

    from device_loop.core.scopes import TokenScope
    try:
        return TokenScope.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise click.BadParameter(f"{'.'.join(map(str, first['loc']))}: {first['msg']}", param_hint="--scope") from None


scope_options = [
    click.option("--scope", "scope", multiple=True, metavar="KEY=VALUE",
                 help="what it may do (repeatable): class=A,B (the classes it may reserve), tag=T (only devices with "
                      "one of these tags), op=exec,power.cycle (the operations it may run; op= none), leases=N (the "
                      "most at once), lease=2h (the longest lease)"),
    click.option("--budget", help="device-time it may hold leases for: 120m/day (each UTC day) or 10h/token "
                                  "(its whole life)"),
    click.option("--band", type=click.Choice([band.value for band in Band]),
                 help="its queue tickets' priority band (default: normal)"),
]


def _scoped(func):
    for option in reversed(scope_options):
        func = option(func)
    return func


@click.group("admin")
def admin_group():
    """Lab administration (needs an admin token, or the database itself)."""


@admin_group.group("token")
def token_group():
    """API tokens for people and exporters."""


@token_group.command("create")
@click.argument("user", required=False)
@click.option("--admin", is_flag=True, help="an admin token")
@click.option("--exporter", "host", help="a token for the exporter of this host (instead of USER)")
@click.option("--expires", help="e.g. 30d (default: never)")
@click.option("--kind", type=click.Choice(["person", "agent"]), default="person", show_default=True,
              help="an agent's queue tickets are batch: served after the people's (never starved)")
@_scoped
@_direct
@json_option
@click.pass_context
def token_create(ctx, user, admin, host, expires, kind, scope, budget, band, database_url, data_dir, as_json):
    """Make a token for USER, or for an exporter (--exporter HOST); --scope, --budget and --band
    bound what it may do (e.g. --kind agent --scope class=rpi4 --scope op=exec,power.cycle --budget 120m/day)."""
    if (user is None) == (host is None):
        raise click.UsageError("name a USER or give --exporter HOST")
    try:
        expires_s = parse_duration(expires) if expires else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--expires") from None
    fields = _scope_given(scope, budget)
    url = _database_url(database_url, data_dir)
    if url:
        from device_loop.coordinator.identity import issue_token
        from device_loop.coordinator.rules import Rules

        given = _scope_model(fields)

        async def create(store):
            await Rules(store).admin.judge_scope(given)
            made = await issue_token(store, time.time, user, admin, host, expires_s, kind, given,
                                     Band(band or Band.NORMAL))
            await _audit_direct(store, "token_create", {k: made[k] for k in ("id", "user", "admin", "host", "kind",
                                                                             "scope", "band")})
            return made
        emit(as_json, asyncio.run(_on_database(url, create)), _token_text)
    else:
        ctx.invoke(_token_create_api, username=user, admin=admin, host=host, expires_s=expires_s, kind=kind,
                   scope=fields, band=band, as_json=as_json)


@click.command()
@lab_command
def _token_create_api(lab, username, admin, host, expires_s, kind, scope, band, as_json):
    made = lab.api.post("/admin/tokens", {"user": username, "admin": admin, "exporter_host": host,
                                          "expires_s": expires_s, "kind": kind, "scope": scope,
                                          "band": band or Band.NORMAL})
    emit(as_json, made, _token_text)


@token_group.command("set")
@click.argument("token_id")
@_scoped
@click.option("--no-limit", "lifted", multiple=True, type=click.Choice(["class", "tag", "op", "leases", "lease",
                                                                        "budget"]),
              help="lift that limit of its scope (repeatable)")
@click.option("--unscoped", is_flag=True, help="take its scope away")
@_direct
@json_option
@click.pass_context
def token_set(ctx, token_id, scope, budget, band, lifted, unscoped, database_url, data_dir, as_json):
    """Change a token's scope or band in place (by its id, tok-...): what --scope, --budget and
    --no-limit name is changed, the rest of its scope stays; its next call is held to it."""
    fields = _scope_given(scope, budget, lifted)
    if fields is None and band is None and not unscoped:
        raise click.UsageError("say what to change: --scope, --budget, --no-limit, --band or --unscoped")
    url = _database_url(database_url, data_dir)
    if url:
        from device_loop.coordinator.identity import token_view
        from device_loop.coordinator.rules import Rules
        from device_loop.core.scopes import TokenScope

        given = None if fields is None else TokenScope.model_construct(**fields)  # (judged whole, once merged)

        async def change(store):
            return token_view(await Rules(store).admin.set_token(token_id, given, band and Band(band), unscoped,
                                                                 f"database:{getpass.getuser()}"))
        emit(as_json, asyncio.run(_on_database(url, change)), _token_line)
    else:
        ctx.invoke(_token_set_api, token_id=token_id, scope=fields, band=band, unscoped=unscoped, as_json=as_json)


@click.command()
@lab_command
def _token_set_api(lab, token_id, scope, band, unscoped, as_json):
    emit(as_json, lab.api.post(f"/admin/tokens/{token_id}", {"scope": scope, "band": band, "unscoped": unscoped}),
         _token_line)


@token_group.command("ls")
@_direct
@json_option
@click.pass_context
def token_ls(ctx, database_url, data_dir, as_json):
    """List tokens (never their secrets)."""
    url = _database_url(database_url, data_dir)
    if url:
        from device_loop.coordinator.identity import token_view
        from device_loop.coordinator.rules import Rules

        rows = asyncio.run(_on_database(url, lambda store: Rules(store).admin.tokens()))
        emit(as_json, [token_view(r) for r in rows], _tokens_text)
    else:
        ctx.invoke(_token_ls_api, as_json=as_json)


@click.command()
@lab_command
def _token_ls_api(lab, as_json):
    emit(as_json, lab.api.get("/admin/tokens"), _tokens_text)


@token_group.command("revoke")
@click.argument("token_id")
@_direct
@json_option
@click.pass_context
def token_revoke(ctx, token_id, database_url, data_dir, as_json):
    """Revoke a token at once (by its id, tok-...)."""
    url = _database_url(database_url, data_dir)
    if url:
        async def revoke(store):
            from device_loop.coordinator.rules import Rules

            return await Rules(store).admin.revoke_token(token_id, f"database:{getpass.getuser()}")
        emit(as_json, asyncio.run(_on_database(url, revoke)), lambda r: f"{token_id} revoked")
    else:
        ctx.invoke(_token_revoke_api, token_id=token_id, as_json=as_json)


@click.command()
@lab_command
def _token_revoke_api(lab, token_id, as_json):
    emit(as_json, lab.api.post(f"/admin/tokens/{token_id}/revoke"), lambda r: f"{token_id} revoked")


def _live_lease_of(lab, target: str) -> str:
    """A lease id, or the id of the live lease on device ``target`` (admins see it)."""
    if target.startswith(LEASE_PREFIX):
        return target
    device = lab.api.get(f"/devices/{target}")  # an unknown device says so
    if "lease" not in device:
        raise CoordinatorError(ErrorCode.FORBIDDEN, "taking a lease back needs an admin token")
    if device["lease"] is None:
        raise CoordinatorError(ErrorCode.NO_LEASE, f"{target} has no live lease (it is {device['state']})")
    return device["lease"]


@admin_group.command("release")
@click.argument("target", metavar="LEASE|DEVICE")
@click.option("--force", is_flag=True, required=True, help="yes, take it from its holder")
@json_option
@lab_command
def admin_release(lab, target, force, as_json):
    """Take a lease (or the lease on a device) back from its holder: it ends as revoked."""
    emit(as_json, lab.api.post(f"/admin/leases/{_live_lease_of(lab, target)}/revoke"), lease_text)


@admin_group.command("retire")
@click.argument("device")
@click.option("--undo", is_flag=True, help="bring a retired device back")
@click.option("--force", is_flag=True, help="also when it is leased: its lease is revoked")
@json_option
@lab_command
def admin_retire(lab, device, undo, force, as_json):
    """Take a device out of the lab."""
    emit(as_json, lab.api.post(f"/admin/devices/{device}/retire", {"retired": not undo, "force": force}),
         lambda d: f"{d['name']} is {d['state']}")


@admin_group.command("clear-fault")
@click.argument("device")
@json_option
@lab_command
def admin_clear_fault(lab, device, as_json):
    """Clear DEVICE's fault (a failed step's, a permanent health failure's, an admin's): it is idle again."""
    emit(as_json, lab.api.post(f"/admin/devices/{device}/clear-fault"), lambda d: f"{d['name']} is {d['state']}")


@admin_group.command("kill-orphans")
@click.argument("device")
@click.option("--detach", is_flag=True,
              help="print the operation's id and return; follow it with 'device-loop op OP --wait'")
@json_option
@lab_command
def admin_kill_orphans(lab, device, detach, as_json):
    """Have DEVICE's exporter kill the processes that still hold its node after its lease ended
    (a container's too): those it sees itself, each checked again; the device is then reclaimed."""
    from .operations import follow_and_show  # (the operations' printing, loaded only here)

    follow_and_show(lab, lab.api.post(f"/admin/devices/{device}/orphans/kill"), detach, as_json)


@admin_group.command("fault")
@click.argument("device")
@click.option("--reason", required=True, help="why it is faulty, for the people who read its page")
@json_option
@lab_command
def admin_fault(lab, device, reason, as_json):
    """Mark DEVICE faulty by hand: it stays faulty, whatever its health, until clear-fault."""
    emit(as_json, lab.api.post(f"/admin/devices/{device}/fault", {"reason": reason}),
         lambda d: f"{d['name']} is {d['state']}")


@admin_group.command("drain")
@click.argument("host")
@click.option("--undo", is_flag=True, help="take leases on this host again")
@json_option
@lab_command
def admin_drain(lab, host, undo, as_json):
    """No new leases on HOST's devices; the live ones run out."""
    emit(as_json, lab.api.post(f"/admin/hosts/{host}/drain", {"draining": not undo}),
         lambda h: f"{h['name']} {'drains: no new leases' if h['draining'] else 'takes leases again'}")


def _forgotten_text(answer: dict) -> str:
    if answer["forgotten"] == "device":
        return f"forgot device {answer['name']} (its leases stay in the audit log)"
    return f"forgot host {answer['name']} and its devices: {', '.join(answer['devices']) or 'none'}"


@admin_group.command("forget")
@click.argument("name", metavar="HOST|DEVICE")
@click.option("--device", "kind", flag_value="device", help="it is the device (a host has that name too)")
@click.option("--host", "kind", flag_value="host", help="it is the host (a device has that name too)")
@json_option
@lab_command
def admin_forget(lab, name, kind, as_json):
    """Remove an offline device, or an offline host with its devices, for good: none may be
    leased. A device or host that reports again is registered anew."""
    emit(as_json, lab.api.post("/admin/forget", {"name": name, "kind": kind}), _forgotten_text)


@admin_group.command("audit")
@json_option
@lab_command
def admin_audit(lab, as_json):
    """The last 100 entries of the audit log (leases, admin actions)."""
    def detail(row: dict) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(row["detail"].items())) or "-"

    emit(as_json, lab.api.get("/admin/audit"), lambda rows: table(
        ["TIME", "ACTOR", "ACTION", "DEVICE", "LEASE", "DETAIL"],
        [[r["at"], r["actor"], r["action"], r["device"] or "-", r["lease"] or "-", detail(r)] for r in rows]))


@admin_group.command("candidates")
@json_option
@lab_command
def admin_candidates(lab, as_json):
    """What exporters found on the network; adopt one to make it bookable."""
    emit(as_json, lab.api.get("/admin/candidates"), lambda rows: table(
        ["IDENTIFIER", "HOST", "KIND", "PLUGIN", "LABEL", "SEEN", "ADOPTED AS"],
        [[c["identifier"], c["host"], c["kind"], c["plugin"], c["label"], c["last_seen"], c["adopted_as"] or "-"]
         for c in rows]) if rows else "no candidates")


@admin_group.command("adopt")
@click.argument("identifier", metavar="CANDIDATE")
@click.option("--name", required=True, help="the device's name in the lab")
@click.option("--class", "device_class", default="generic", show_default=True)
@click.option("--tag", "tags", multiple=True)
@json_option
@lab_command
def admin_adopt(lab, identifier, name, device_class, tags, as_json):
    """Make a network candidate a device, named NAME, of the host that found it."""
    emit(as_json, lab.api.post(f"/admin/candidates/{identifier}/adopt",
                               {"name": name, "class": device_class, "tags": list(tags)}), lambda r: r["note"])
