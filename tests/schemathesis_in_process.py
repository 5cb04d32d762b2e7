"""schemathesis' ``run`` command in this process, against an ASGI app: the same engine, the
same verdict and the same report as ``schemathesis run URL``, without a server to reach the
app through nor a process of its own (their start and their HTTP were a fifth of its cost).

The engine reaches the app as schemathesis' ASGI transport does (``schemathesis.openapi.from_asgi``):
on an event loop of schemathesis' own, in a thread, where the app's lifespan runs from the first
request (``client``) until ``stop``. Hooks are schemathesis' global ones (``@schemathesis.hook``).
Its probes of the HTTP server in front (does it refuse a NUL in a header?) find none, so every
request reaches the app as generated: a NUL in a header too, which uvicorn refuses (400) before
an app sees it.
"""
from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

from schemathesis.cli.commands.run.context import ExecutionContext
from schemathesis.cli.commands.run.handlers.output import OutputHandler
from schemathesis.cli.events import LoadingFinished, LoadingStarted
from schemathesis.cli.executor import execute_event_loop
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import from_schema
from schemathesis.openapi import from_asgi
from schemathesis.python import asgi

#: The Host every request names: a loopback name, as a local client's do (schemathesis' own,
#: ``testserver``, is no name a coordinator answers: 421).
HOST = "127.0.0.1"


def client(app, headers: dict[str, str]) -> asgi.ASGIClient:
    """A ``requests`` session to ``app`` through schemathesis' ASGI transport (paths from ``/``):
    entered (``with``), it starts the app's lifespan on schemathesis' loop, which a run then uses."""
    session = asgi.ASGIClient(app, base_url=f"http://{HOST}")
    session.headers.update(headers)
    return session


def stop() -> None:
    """End the lifespan of every app schemathesis started (else it runs until the process exits)."""
    asgi.shutdown_lifespans()


def run(app, location: str, settings: dict[str, Any], folder: Path, *, checks: list[str], exclude_checks: list[str],
        phases: list[str], max_examples: int) -> tuple[int, str]:
    """``schemathesis run`` of the document the app serves at ``location`` (a path), with the
    configuration file ``settings`` (as a dict) and the options ``--checks``, ``--exclude-checks``,
    ``--phases``, ``--max-examples``, ``--generation-deterministic --workers 1 --no-color
    --output-sanitize false``, run in ``folder`` (where it keeps its cache): (its exit code, its report)."""
    # (no base URL: the app's own, no network address, so that no probe is sent to one)
    config = SchemathesisConfig.from_dict({**settings, "color": False, "output": {"sanitization": {"enabled": False}},
                                           "cache": {"directory": str(folder / ".schemathesis")},
                                           "headers": {**settings.get("headers", {}), "Host": HOST}})
    # what the command's options do to the configuration (schemathesis.cli.commands.run.run)
    override = config.projects.override
    override.update(workers=1)
    override.phases.update(phases=phases)
    override.checks.update(included_check_names=checks, excluded_check_names=exclude_checks)
    override.generation.update(max_examples=max_examples, deterministic=True)

    def events():  # (schemathesis.cli.loaders.into_event_stream, with the schema the app serves)
        started = LoadingStarted(location=location)
        yield started
        schema = from_asgi(location, app, config=config, headers={"Host": HOST})
        yield LoadingFinished.from_schema(schema, location=location, start_time=started.timestamp,
                                          base_url=schema.get_base_url())
        yield from from_schema(schema).execute()

    project = config.projects.get_default()
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        try:
            execute_event_loop(events(), config=project, args=[], params={},
                               output_handler=OutputHandler(config=project),
                               context_factory=lambda loaded: ExecutionContext(config=loaded))
        except SystemExit as verdict:  # (how the command ends, with its exit code)
            return int(verdict.code or 0), report.getvalue()
    raise AssertionError(f"schemathesis' run ended without its verdict:\n{report.getvalue()}")
