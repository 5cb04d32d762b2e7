"""``device-loop exporter --config FILE``: run this host's exporter in the foreground."""
from __future__ import annotations

import logging

import click

from device_loop.core.stop_signals import on_stop_signals
from device_loop.core.tokens import TokenFileError

from .config import ConfigError, load_config
from .daemon import Exporter


class ConfigRefused(click.ClickException):
    """A config the exporter refuses (exit code 1: refused, as the README says)."""


@click.command("exporter")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False, exists=True),
              help="exporter TOML config (see docs/exporter-config.md)")
def exporter_command(config_path):
    """Run the exporter: discover this host's devices and serve their leases."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise ConfigRefused(str(exc)) from None
    try:
        exporter = Exporter(config)
    except TokenFileError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        exporter.check_config()  # against the plugins' models, before it logs or serves anything
    except ConfigError as exc:
        raise ConfigRefused(str(exc)) from None
    on_stop_signals(lambda signum: exporter.stop())
    logging.getLogger("device_loop.exporter").info(
        "exporter %s -> %s, state in %s", exporter.name, config.exporter.coordinator, config.state_dir)
    exporter.run()
