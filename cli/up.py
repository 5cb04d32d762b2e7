"""``device-loop up``: a whole lab on this machine, in the foreground.

A coordinator on SQLite in the data folder, an exporter for this host, and simulated
boards ``sim-board-0`` and ``sim-board-1`` (plus the devices of ``--config``), each with a
simulated camera, a file-backed flash target and a power switch (the ``sim`` backend: off
silences the board and hangs up its UART, on boots it; a board whose health fails while
nobody holds it is power-cycled once on its own), and their firmware in the image
registry, known-good. Where Xvfb, x11vnc and noVNC are installed each simulated board
also has a screen: a virtual X display the lab starts (and stops) itself. All run as
child processes; Ctrl-C stops the exporter (which stops every service), then the
coordinator, then the displays.
"""
from __future__ import annotations

import hashlib
import os
import random
import select
import shutil
import socket
import threading
from pathlib import Path

import click
import tomli_w

from device_loop.coordinator.serve import default_data_dir
from device_loop.core.ports import free_port, port_is_free, wait_port_open
from device_loop.core.process import ProcessRegistry, python_module, start_ticks
from device_loop.core.stop_signals import on_stop_signals
from device_loop.core.plugins import PluginSet
from device_loop.exporter.config import ConfigError, load_config, parse_config, parse_entries
from device_loop.exporter.run import ConfigRefused
from device_loop.plugins.vnc import NOVNC

from .up_tokens import lab_tokens
from .up_vms import vm_slots

SIM_CLASS = "sim-board"
SIM_FIRMWARE = "sim-firmware-1.0"  # the simulated boards' known-good image
SIM_COOL_BELOW = "45C"  # a few degrees above the simulated boards' ambient (40 °C): a leased board cools below it
#: What each simulated board is, as its shell shows it (plugins/sim/facts.py), and its tags, so
#: that a matrix over tags (rvv, sve2, neon, avx2: one has no board) can be tried here. A
#: board cools with a time constant of 5 s, so that the cooldown between two runs of an A/B
#: pair (run-workload, 1 s a run) takes seconds, and runs back to back without one heat it past
#: its knee (50 °C) within a few runs.
SIM_BOARDS = {
    "sim-board-0": {"tags": ["sim", "rvv"], "arch": "riscv64", "cpu_model": "sim,rv64-c908", "cores": 4,
                    "isa": ["i", "m", "a", "f", "d", "c", "v", "zicsr", "zifencei", "zba", "zbb", "zbs", "zvbb"]},
    "sim-board-1": {"tags": ["sim", "neon", "sve2"], "arch": "aarch64", "cpu_part": "0xd49", "cores": 8,
                    "isa": ["fp", "asimd", "evtstrm", "aes", "pmull", "sha1", "sha2", "crc32", "atomics", "fphp",
                            "asimdhp", "cpuid", "asimdrdm", "lrcpc", "dcpop", "asimddp", "sve", "sve2", "i8mm",
                            "bf16"]},
}
SIM_NAMES = tuple(SIM_BOARDS)
SIM_TAU = "5s"
SIM_FIRMWARE_BYTES = 8 << 20
SCREEN = "1024x768x24"  # a simulated board's screen: width x height x depth
SCREEN_TOOLS = ("Xvfb", "x11vnc", "websockify")  # and noVNC's files


def sim_firmware() -> bytes:
    return random.Random(SIM_FIRMWARE).randbytes(SIM_FIRMWARE_BYTES)


def sim_flash_target(data_dir: Path, board: str) -> Path:
    """A simulated board's flash: a file, as a VM's disk would be."""
    return data_dir / "flash" / f"{board}.img"


def _prepare_sim_flash(data_dir: Path) -> None:
    """Each simulated board's flash holds its firmware when first seen."""
    for board in SIM_NAMES:
        target = sim_flash_target(data_dir, board)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(sim_firmware())


def _register_sim_firmware(url: str, exporter, stop: threading.Event, token: str | None) -> str | None:
    """Put the simulated boards' firmware in the registry, known-good for their class, once
    the boards are registered (as ``token``'s admin, on a lab with tokens); None, or why it could not."""
    from device_loop.client.http import Coordinator, CoordinatorError

    api = Coordinator(url, token=token)
    try:
        while not stop.is_set() and exporter.alive():
            if {d["name"] for d in api.get("/devices")} >= set(SIM_NAMES):
                break
            stop.wait(0.2)
        else:
            return "the simulated boards never registered"
        if not any(i["name"] == SIM_FIRMWARE for i in api.get("/images")):
            firmware = sim_firmware()
            api.upload("/images", {"name": SIM_FIRMWARE, "for": SIM_CLASS, "size": len(firmware),
                                   "sha256": hashlib.sha256(firmware).hexdigest(),
                                   "description": "the simulated boards' firmware"}, iter([firmware]))
            api.post(f"/admin/images/{SIM_FIRMWARE}/known-good", {"for": SIM_CLASS})
        return None
    except CoordinatorError as exc:
        return exc.message
    finally:
        api.close()


def lab_config(data_dir: Path, url: str, config_path: str | None, vms: list[dict] | None = None) -> dict:
    """The exporter config of the local lab: simulated boards plus the user's devices (and
    the VM slots ``vms``, cli/up_vms.py)."""
    user: dict = {}
    if config_path:  # refused as `device-loop exporter --config` refuses it, then merged as written
        try:
            user = load_config(config_path).model_dump(mode="json", by_alias=True, exclude_unset=True)
        except ConfigError as exc:
            raise ConfigRefused(str(exc)) from None
    # the trust mode gates nothing: the lab's services listen on loopback, whatever the file says
    exporter = {"name": socket.gethostname().split(".")[0] or "local", **user.get("exporter", {}),
                "coordinator": url, "state_dir": str(data_dir / "exporter"),
                "bind_address": "127.0.0.1", "advertise_address": "127.0.0.1"}
    # between two leases a board cools down: `stress` on its console, release it, and `device-loop ls`
    # shows it reclaiming ("cooling down: ...") for some ten seconds
    sims = [{"name": name, "class": SIM_CLASS, "tags": SIM_BOARDS[name]["tags"],
             "resources": [{"plugin": "sim", "tau": SIM_TAU,
                            **{key: value for key, value in SIM_BOARDS[name].items() if key != "tags"}},
                           {"plugin": "flash", "target": str(sim_flash_target(data_dir, name))},
                           {"plugin": "video", "source": "sim"},
                           {"plugin": "power", "backend": "sim"}],
             "steps": [{"step": "cooldown", "below": SIM_COOL_BELOW, "timeout": "3m"}],
             "auto_recover": "power-cycle"}
            for name in SIM_NAMES]
    # the user's devices first, so that config errors name the same positions as in their file
    config = {"exporter": exporter, "plugins": user.get("plugins", {}),
              "devices": user.get("devices", []) + sims + (vms or []),
              "classes": user.get("classes", {})}
    try:
        parsed = parse_config(config, config_path or "the lab config")
    except ConfigError as exc:
        names = ", ".join(SIM_NAMES + tuple(vm["name"] for vm in vms or []))
        raise ConfigRefused(f"{exc}\n(the lab adds devices named {names})") from None
    try:  # each entry against its plugin's model, as the exporter checks it before it serves anything
        parse_entries(parsed, PluginSet(parsed.plugins.enable, parsed.plugins.disable).config_models())
    except ConfigError as exc:
        raise ConfigRefused(str(exc)) from None
    return config


def _no_screens_because(plugins: dict) -> str | None:
    """Why the simulated boards get no screen here (a missing tool, the vnc plugin left
    out by --config), or None."""
    if "vnc" in plugins.get("disable", []) or "vnc" not in plugins.get("enable", ["vnc"]):
        return "--config leaves the vnc plugin out"
    missing = [tool for tool in SCREEN_TOOLS if shutil.which(tool) is None]
    missing += [] if (NOVNC / "vnc.html").exists() else ["noVNC"]
    return f"{', '.join(missing)} not installed (apt-get install xvfb x11vnc novnc)" if missing else None


def _start_display(registry: ProcessRegistry, board: str):
    """A virtual X display for ``board``, on a number Xvfb finds free: (its process, ":N"),
    or (None, why not)."""
    said, write = os.pipe()
    try:
        xvfb = registry.spawn(["Xvfb", "-displayfd", str(write), "-screen", "0", SCREEN, "-nolisten", "tcp"],
                              name=f"xvfb-{board}", pass_fds=(write,), die_with_parent=True)
    finally:
        os.close(write)
    with os.fdopen(said) as number:  # written once the display takes clients; nothing if Xvfb fails
        display = number.readline().strip() if select.select([number], [], [], 15)[0] else ""
    if display.isdigit():
        return xvfb, f":{display}"
    xvfb.stop()
    return None, f"Xvfb did not start (see {xvfb.log_path})"


def _add_screens(registry: ProcessRegistry, config: dict, displays: list) -> str:
    """Give each simulated board of ``config`` a screen where this machine can (its display's
    process goes into ``displays``): a line that says which board has which display, or why
    none has one."""
    why_not = _no_screens_because(config["plugins"])
    shown = []
    for device in config["devices"]:
        if device["name"] not in SIM_NAMES or why_not:
            continue
        xvfb, display = _start_display(registry, device["name"])
        if xvfb is None:
            why_not = display
            break
        displays.append(xvfb)
        device["resources"].append({"plugin": "vnc", "display": display})
        shown.append((device["name"], display))
    line = ", ".join(f"{board} {display}" for board, display in shown) or "none"
    if why_not:
        return f"{line} ({why_not})"
    return f"{line}  (X displays: DISPLAY={shown[0][1]} xterm opens on {shown[0][0]}'s)"


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
@click.option("--ssh-logins", "ssh_logins", type=click.Path(dir_okay=False, exists=True),
              help="how the coordinator's MCP exec logs in to the ssh boards of --config (device-loop coordinator "
                   "--help)")
@click.option("--tokens", is_flag=True, help="a lab with tokens, not the trust mode: an admin token is made (kept in "
                                            "DATA_DIR/admin-token) and printed, to try tokens, scopes and budgets")
@click.option("--no-vms", is_flag=True, help="start no VM slot, even where QEMU is installed")
@click.option("--guest-cache", type=click.Path(file_okay=False, path_type=Path), envvar="DEVICE_LOOP_GUEST_CACHE",
              help="where the VM guests' Debian packages are kept (or DEVICE_LOOP_GUEST_CACHE; default "
                   "DATA_DIR/guests)")
def up_command(data_dir: Path, port: int, config_path: str | None, ssh_logins: str | None, tokens: bool,
               no_vms: bool, guest_cache: Path | None):
    """Start a local lab: coordinator + exporter + simulated boards, and VM slots where QEMU
    is installed. Ctrl-C stops it. Anyone on this machine may use it (the trust mode), unless
    --tokens: then every caller needs a token, and an admin token is printed."""
    data_dir = data_dir.expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    if not port_is_free("127.0.0.1", port):  # before anything starts: its exporter would join that lab
        raise click.ClickException(f"port {port} is taken (another lab?): stop it, or start this one with "
                                   f"--port {free_port()} and its own --data-dir")
    url = f"http://127.0.0.1:{port}"
    config = lab_config(data_dir, url, config_path)  # a config it refuses starts nothing

    registry = ProcessRegistry(data_dir / "up")
    _claim_data_dir(data_dir)
    if no_vms:
        vms: list[dict] = []
        vm_line = "none (--no-vms)"
    else:
        vms, vm_line = vm_slots(data_dir, config["plugins"], guest_cache and guest_cache.expanduser().resolve(),
                                say=lambda line: click.echo(line, err=True))
        config = lab_config(data_dir, url, config_path, vms)
    registry.stop_leftovers()
    stop = threading.Event()
    on_stop_signals(lambda signum: stop.set())

    run = python_module("device_loop.cli")
    # a token in the caller's shell is for some other lab: this one has none
    env = {k: v for k, v in os.environ.items() if k != "DEVICE_LOOP_TOKEN"}
    children: list = []
    displays: list = []  # stopped in this order: the exporter, the coordinator; then the displays
    try:
        screens = _add_screens(registry, config, displays)
        config_file = data_dir / "exporter.toml"
        config_file.write_text(tomli_w.dumps(config))
        logins = ["--ssh-logins", str(Path(ssh_logins).resolve())] if ssh_logins else []
        admin_token = None
        if tokens:  # (made on the database before the coordinator opens it)
            admin_file, exporter_file = lab_tokens(data_dir, config["exporter"]["name"])
            admin_token = admin_file.read_text().strip()
            config["exporter"]["token_file"] = str(exporter_file)
            config_file.write_text(tomli_w.dumps(config))
        trust = [] if tokens else ["--single-user"]
        coordinator = registry.spawn(run + ["coordinator", "--data-dir", str(data_dir), "--port", str(port),
                                            *trust, *logins], name="coordinator", die_with_parent=True, env=env)
        children.append(coordinator)
        if not wait_port_open("127.0.0.1", port, timeout=20) or not coordinator.alive():
            raise click.ClickException(f"the coordinator did not start:\n{coordinator.output()[-2000:]}")
        _prepare_sim_flash(data_dir)
        exporter = registry.spawn(run + ["exporter", "--config", str(config_file)], name="exporter",
                                  die_with_parent=True, env=env)
        children.insert(0, exporter)
        problem = _register_sim_firmware(url, exporter, stop, admin_token)
        if problem:
            click.echo(f"note: the simulated boards' firmware is not in the registry: {problem}", err=True)
        devices = ", ".join(d["name"] for d in config["devices"])
        point = "" if port == 7420 else f"export DEVICE_LOOP_COORDINATOR={url}; "
        if tokens:
            point += f"export DEVICE_LOOP_TOKEN=$(cat {data_dir / 'admin-token'}); "
            mode = "with tokens: every caller needs one"
            token_line = (f"  admin token  {admin_token}  (kept in {data_dir / 'admin-token'}; make more: device-loop "
                          f"admin token create NAME [--kind agent] [--scope ...] [--budget ...])\n")
        else:
            mode, token_line = "single-user trust mode: anyone on this machine may use it; tokens are ignored", ""
        click.echo(f"device-loop lab up ({mode})\n{token_line}"
                   f"  coordinator  {url}  (SQLite in {data_dir})\n"
                   f"  web page     {url}/  (live board; /metrics for Prometheus)\n"
                   f"  exporter     {config['exporter']['name']}  devices: {devices}\n"
                   f"  screens      {screens}\n"
                   f"  VMs          {vm_line}\n"
                   f"  logs         {registry.logs}\n"
                   f"Try: {point}device-loop ls; device-loop reserve sim-board-0 --wait\n"
                   f"     device-loop video sim-board-0  (its camera, for a browser)\n"
                   + ("     device-loop vnc sim-board-0  (its screen, for a browser)\n" if displays else "") +
                   ("     device-loop reserve --needs any --wait  (a fresh VM, booted ahead: "
                    f"{' or '.join(vm['name'] for vm in vms)})\n" if vms else "") +
                   f"     device-loop flash sim-board-0 {SIM_FIRMWARE}  (its flash is the file "
                   f"{sim_flash_target(data_dir, SIM_NAMES[0])})\nCtrl-C stops the lab.")
        while not stop.wait(0.5):
            dead = [p for p in children if not p.alive()]
            if dead:
                raise click.ClickException(f"{dead[0].name} exited:\n{dead[0].output()[-2000:]}")
    finally:
        for proc in children + displays:
            proc.stop(grace=15)
        click.echo("lab stopped")
