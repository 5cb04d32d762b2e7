"""``device-loop up``: a whole lab on this machine, in the foreground.

A coordinator on SQLite in the data folder, an exporter for this host, and simulated
boards ``sim-board-0`` and ``sim-board-1`` (plus the devices of ``--config``). Both run
as child processes; Ctrl-C stops the exporter (which stops every service) and then the
coordinator.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import tomllib
from pathlib import Path

import click
import tomli_w

from device_loop.coordinator.serve import default_data_dir
from device_loop.core.ports import free_port, port_is_free, wait_port_open
from device_loop.core.process import ProcessRegistry, start_ticks
from device_loop.exporter.config import ConfigError, parse_config

SIM_BOARDS = 2


def lab_config(data_dir: Path, url: str, config_path: str | None) -> dict:
    """The exporter config of the local lab: simulated boards plus the user's devices."""
    user: dict = {}
    if config_path:
        try:
            user = tomllib.loads(Path(config_path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise click.ClickException(f"cannot use {config_path}: {exc}") from None
    # the trust mode gates nothing: the lab's services listen on loopback, whatever the file says
    exporter = {"name": socket.gethostname().split(".")[0] or "local", **user.get("exporter", {}),
                "coordinator": url, "state_dir": str(data_dir / "exporter"),
                "bind_address": "127.0.0.1", "advertise_address": "127.0.0.1"}
    sims = [{"name": f"sim-board-{i}", "plugin": "sim", "class": "sim-board", "tags": ["sim"]}
            for i in range(SIM_BOARDS)]
    # the user's devices first, so that config errors name the same positions as in their file
    config = {"exporter": exporter, "plugins": user.get("plugins", {}), "devices": user.get("devices", []) + sims}
    try:
        parse_config(config, config_path or "the lab config")
    except ConfigError as exc:
        names = ", ".join(d["name"] for d in sims)
        raise click.ClickException(f"{exc}\n(the lab adds simulated boards named {names})") from None
    return config


def _claim_data_dir(data_dir: Path) -> None:
    """Refuse to start a second lab on a data folder whose lab is still running."""
    pidfile = data_dir / "up.pid"
    try:
        pid, ticks = (int(x) for x in pidfile.read_text().split())
    except (OSError, ValueError):
        pid, ticks = 0, None
    if pid and pid != os.getpid() and start_ticks(pid) == ticks:
        raise click.ClickException(f"a lab on {data_dir} is already running (pid {pid}); stop it first, "
                                   "or give this one another --data-dir and --port")
    pidfile.write_text(f"{os.getpid()} {start_ticks(os.getpid())}")


@click.command("up")
@click.option("--data-dir", type=click.Path(path_type=Path), default=default_data_dir,
              show_default="~/.local/share/device-loop")
@click.option("--port", default=7420, show_default=True, type=click.IntRange(1, 65535))
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True),
              help="an exporter config whose devices join the lab (e.g. a real UART)")
def up_command(data_dir: Path, port: int, config_path: str | None):
    """Start a local lab: coordinator + exporter + simulated boards. Ctrl-C stops it."""
    data_dir = data_dir.expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    if not port_is_free("127.0.0.1", port):  # before anything starts: its exporter would join that lab
        raise click.ClickException(f"port {port} is taken (another lab?): stop it, or start this one with "
                                   f"--port {free_port()} and its own --data-dir")
    url = f"http://127.0.0.1:{port}"
    config = lab_config(data_dir, url, config_path)
    config_file = data_dir / "exporter.toml"
    config_file.write_text(tomli_w.dumps(config))

    registry = ProcessRegistry(data_dir / "up")
    _claim_data_dir(data_dir)
    registry.stop_leftovers()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: the terminal closed
        signal.signal(sig, lambda *_: stop.set())

    run = [sys.executable, "-m", "device_loop.cli"]
    # a token in the caller's shell is for some other lab: this one has none
    env = {k: v for k, v in os.environ.items() if k != "DEVICE_LOOP_TOKEN"}
    coordinator = registry.spawn(run + ["coordinator", "--data-dir", str(data_dir), "--port", str(port), "--single-user"],
                                 name="coordinator", die_with_parent=True, env=env)
    children = [coordinator]
    try:
        if not wait_port_open("127.0.0.1", port, timeout=20) or not coordinator.alive():
            raise click.ClickException(f"the coordinator did not start:\n{coordinator.output()[-2000:]}")
        exporter = registry.spawn(run + ["exporter", "--config", str(config_file)], name="exporter",
                                  die_with_parent=True, env=env)
        children.insert(0, exporter)
        devices = ", ".join(d["name"] for d in config["devices"])
        point = "" if port == 7420 else f"export DEVICE_LOOP_COORDINATOR={url}; "
        click.echo(f"device-loop lab up (single-user trust mode: anyone on this machine may use it)\n"
                   f"  coordinator  {url}  (SQLite in {data_dir})\n"
                   f"  exporter     {config['exporter']['name']}  devices: {devices}\n"
                   f"  logs         {registry.logs}\n"
                   f"Try: {point}device-loop ls; device-loop reserve sim-board-0 --wait\nCtrl-C stops the lab.")
        while not stop.wait(0.5):
            dead = [p for p in children if not p.alive()]
            if dead:
                raise click.ClickException(f"{dead[0].name} exited:\n{dead[0].output()[-2000:]}")
    finally:
        for proc in children:
            proc.stop(grace=15)
        click.echo("lab stopped")
