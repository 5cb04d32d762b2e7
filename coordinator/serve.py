"""``device-loop coordinator``: serve the coordinator with uvicorn."""
from __future__ import annotations

import asyncio
import logging
import os
import resource
from pathlib import Path
from urllib.parse import urlsplit

import click
import uvicorn

from device_loop.core.durations import format_duration, parse_duration

from .app import create_app
from .limits import BODY_GAP_S
from .relays import private_addresses
from .rules import Settings
from .slow_clients import HEAD_TIMEOUT_S, head_deadline
from .ssh_logins import SshLogins, SshLoginsError, load_ssh_logins
from .store import Store


def default_data_dir() -> Path:
    base = Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share"))
    return base / "device-loop"


def sqlite_url(data_dir: Path) -> str:
    # the database holds live leases' secrets: the coordinator's folder is its account's alone
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    data_dir.chmod(0o700)
    return f"sqlite:///{data_dir.resolve() / 'coordinator.sqlite'}"


def _seconds(ctx, param, value):
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _kept(ctx, param, value):
    """A retention: a duration, or 'forever' (None: nothing is pruned)."""
    return None if value == "forever" else _seconds(ctx, param, value)


def _check_database(url: str) -> None:
    """Open (and migrate) the database once before serving: one clear line if it cannot be."""
    async def check() -> None:
        store = Store(url)
        await store.connect()
        await store.disconnect()
    try:
        asyncio.run(check())
    except Exception as exc:  # asyncpg, sqlite3 and the OS each raise their own
        shown = urlsplit(url)._replace(netloc=urlsplit(url).netloc.rsplit("@", 1)[-1]).geturl()  # no password
        raise click.ClickException(f"cannot open the database {shown}: {type(exc).__name__}: {exc}") from None


def raise_descriptor_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit (often 1024 of
    524288): each connection holds one. Returns the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def _ssh_logins(ctx, param, path):
    if path is None:
        return SshLogins()
    try:
        return load_ssh_logins(path)
    except SshLoginsError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("coordinator")
@click.option("--database-url", envvar="DEVICE_LOOP_DATABASE_URL", show_envvar=True,
              help="sqlite:///PATH or postgresql://... (default: SQLite in --data-dir)")
@click.option("--data-dir", type=click.Path(path_type=Path), default=default_data_dir,
              show_default="~/.local/share/device-loop")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=7420, show_default=True, type=click.IntRange(0, 65535))
@click.option("--allocating-timeout", default=format_duration(Settings.allocating_timeout_s), show_default=True,
              callback=_seconds, help="how long a lease may stay pending before it fails")
@click.option("--default-ttl", default=format_duration(Settings.default_ttl_s), show_default=True, callback=_seconds)
@click.option("--max-ttl", default=format_duration(Settings.max_ttl_s), show_default=True, callback=_seconds)
@click.option("--single-user", is_flag=True,
              help="trust mode: no tokens, every caller is who it says and may do anything (loopback only)")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME[:PORT]",
              help="a name clients, exporters and agents reach this coordinator by (repeatable); others get 421. "
                   "Loopback is always allowed")
@click.option("--tailnet-socket", type=click.Path(dir_okay=False),
              help="tailscaled's LocalAPI socket: callers without a token are known by their tailnet login")
@click.option("--tailnet-admin", "tailnet_admins", multiple=True, metavar="LOGIN",
              help="a tailnet login that is an admin (repeatable)")
@click.option("--max-leases-per-user", default=Settings.max_leases_per_user, show_default=True, type=click.IntRange(0),
              help="live leases one person may hold at once (0: no limit; admins are exempt)")
@click.option("--image-dir", type=click.Path(file_okay=False, path_type=Path),
              help="where the image registry keeps its files (default: DATA_DIR/images)")
@click.option("--max-image-size", default=Settings.max_image_bytes >> 20, show_default=True, type=click.IntRange(1),
              help="the largest image an upload may bring, in MiB")
@click.option("--image-quota", default=0, show_default=True, type=click.IntRange(0),
              help="MiB of images one person may have in the registry (0: no quota; admins too are held to it)")
@click.option("--batch-max-wait", default=format_duration(Settings.batch_max_wait_s), show_default=True,
              callback=_seconds, help="a batch (agent's) queue ticket waiting longer is served among the people's")
@click.option("--claim-window", default=format_duration(Settings.claim_window_s), show_default=True, callback=_seconds,
              help="a granted ticket's requester must see its lease within this, or it passes to the next ticket")
@click.option("--max-tickets-per-user", default=Settings.max_tickets_per_user, show_default=True,
              type=click.IntRange(0), help="open queue tickets one person may have at once (0: no limit)")
@click.option("--job-worker-timeout", default=format_duration(Settings.job_worker_timeout_s), show_default=True,
              callback=_seconds,
              help="a running job whose worker does not beat within this fails (worker lost) and its leases are "
                   "released")
@click.option("--operation-retention", default=format_duration(Settings.operation_retention_s or 0), show_default=True,
              callback=_kept, help="operations that ended longer ago are pruned ('forever': kept)")
@click.option("--audit-retention", default="forever", show_default=True, callback=_kept,
              help="audit log entries older than this are pruned ('forever': kept)")
@click.option("--max-stored-runs", default=Settings.max_stored_runs, show_default=True, type=click.IntRange(0),
              help="job runs one person may have stored, finished jobs' included until deleted (device-loop job rm; "
                   "0: no limit; admins are counted, not limited)")
@click.option("--header-timeout", default=format_duration(HEAD_TIMEOUT_S), show_default=True, callback=_seconds,
              help="how long a connection may take to send a request's head (its headers) before it is closed")
@click.option("--body-timeout", default=format_duration(BODY_GAP_S), show_default=True, callback=_seconds,
              help="the longest a request's body (an upload's too) may pause before the request is cut (408)")
@click.option("--ssh-logins", "ssh_logins", envvar="DEVICE_LOOP_SSH_LOGINS", show_envvar=True, callback=_ssh_logins,
              type=click.Path(dir_okay=False),
              help="a TOML file of how an MCP exec logs in to boards over ssh: per device or host, the user, the "
                   "coordinator's key file and the board's host key (without it, no ssh from the coordinator)")
@click.option("--private-address", "named_private", multiple=True, metavar="HOST:PORT",
              help="an address the coordinator never fetches a camera's snapshot from (repeatable; where it "
                   "listens and its PostgreSQL are always such)")
def coordinator_command(batch_max_wait, claim_window, max_tickets_per_user, job_worker_timeout, operation_retention,
                        audit_retention, max_stored_runs, header_timeout,
                        body_timeout, database_url, data_dir, host, port, allocating_timeout, default_ttl, max_ttl,
                        single_user, allowed_hosts, tailnet_socket, tailnet_admins, max_leases_per_user, image_dir,
                        max_image_size, image_quota, ssh_logins, named_private):
    """Run the coordinator (leases, devices, hosts, audit log) in the foreground."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if single_user and host not in ("127.0.0.1", "localhost", "::1"):
        raise click.BadParameter("--single-user trusts every caller, so it listens on loopback only",
                                 param_hint="--host")
    if single_user:
        logging.getLogger("device_loop.coordinator").warning(
            "SINGLE-USER TRUST MODE: no tokens; every caller on this machine is trusted as whoever it says it is, "
            "and may call every route, admin ones included")
    database_url = database_url or sqlite_url(data_dir)
    try:
        private = private_addresses(host, port, database_url, named_private)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--private-address") from None
    settings = Settings(allocating_timeout_s=allocating_timeout, default_ttl_s=default_ttl, max_ttl_s=max_ttl,
                        max_leases_per_user=max_leases_per_user, max_image_bytes=max_image_size << 20,
                        image_quota_bytes=(image_quota << 20) or None, batch_max_wait_s=batch_max_wait,
                        claim_window_s=claim_window, max_tickets_per_user=max_tickets_per_user,
                        job_worker_timeout_s=job_worker_timeout, operation_retention_s=operation_retention,
                        audit_retention_s=audit_retention, max_stored_runs=max_stored_runs,
                        image_dir=str(image_dir or Path(data_dir).expanduser() / "images"),
                        ssh_logins=ssh_logins, private_addresses=private)
    _check_database(database_url)
    app = create_app(database_url, settings, single_user=single_user, allowed_hosts=allowed_hosts,
                     tailnet_socket=tailnet_socket, tailnet_admins=tailnet_admins, body_gap_s=body_timeout)
    logging.getLogger("device_loop.coordinator").info(
        "an MCP exec logs in over ssh to %d devices and the devices of %d hosts (--ssh-logins)",
        len(ssh_logins.devices), len(ssh_logins.hosts))
    logging.getLogger("device_loop.coordinator").info("up to %d open files (connections)", raise_descriptor_limit())
    # proxy_headers=False: a local caller must not be able to forge its address.
    uvicorn.run(app, host=host, port=port, proxy_headers=False, log_level="info", access_log=False,
                http=head_deadline(header_timeout), ws="none",  # no route takes a websocket
                timeout_graceful_shutdown=3)  # long-polls would otherwise hold shutdown for 25 s
