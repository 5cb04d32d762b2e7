"""What the exporter's own tests share: their test plugins installed as real packages (loaded
through the ``device_loop`` entry points, past the loader's checks, like any plugin), an
exporter built in-process on them, and the coordinator's side of the protocol played by the
test (for an exporter in a process of its own, killed with SIGKILL or SIGTERM).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from pydantic import ValidationError

from conftest import BUILT_IN_PLUGINS
from device_loop.core import PROTOCOL_VERSION
from device_loop.core.plugins import LOAD_ENV
from device_loop.core.ports import free_port
from device_loop.core.protocol import DesiredOperation, DesiredService, DesiredState, Heartbeat, OperationReport
from device_loop.exporter.config import parse_config
from device_loop.exporter.daemon import Exporter

TESTKIT = Path(__file__).resolve().parent / "plugin_packages" / "devloop-testkit"
TESTKIT_PLUGINS = "flaky,relay,steps"
LONG_POLL_CAP_S = 5.0  # the fake answers a long-poll with nothing new after this long (the real one: its wait)


def installed_testkit(tmp_path_factory) -> Path:
    """A folder with the test plugins pip-installed in it, once per test session (a copy of
    their sources is built, so nothing is written beside them)."""
    site = tmp_path_factory.getbasetemp() / "testkit-site"
    if not (site / "devloop_testkit").exists():
        source = tmp_path_factory.mktemp("testkit-source") / "devloop-testkit"
        shutil.copytree(TESTKIT, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "--disable-pip-version-check",
                        "--target", str(site), str(source)], check=True, capture_output=True, timeout=120)
    return site


def load_testkit(monkeypatch, site: Path) -> None:
    """Make this process's exporters find the test plugins, as an installed package is found."""
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv(LOAD_ENV, f"{BUILT_IN_PLUGINS},{TESTKIT_PLUGINS}")


def with_testkit(env: dict, site: Path) -> dict:
    """The environment of an exporter process that loads the test plugins too."""
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")])),
            LOAD_ENV: f"{BUILT_IN_PLUGINS},{TESTKIT_PLUGINS}"}


def in_process_exporter(tmp_path: Path, devices: list[dict], coordinator: str | None = None,
                        set_up: bool = True, **settings) -> Exporter:
    """An exporter in this process, set up (its plugins loaded and checked) unless ``set_up``
    is false (its ``run`` sets it up); by default its coordinator is a free port nobody listens
    on; ``settings``: more of its ``[exporter]`` section."""
    config = parse_config({
        "exporter": {"name": "host-a", "state_dir": str(tmp_path / "state"), "cdi_dir": str(tmp_path / "cdi"),
                     "coordinator": coordinator or f"http://127.0.0.1:{free_port()}", **settings},
        "devices": devices})
    exporter = Exporter(config)
    if set_up:
        exporter.setup()
    return exporter


def converge(exporter: Exporter, desired: dict) -> bool:
    """Scan and report as the exporter's loop does (nobody answers), then hand it ``desired``
    as the coordinator answers a long-poll, and wait until the starts and stops it began are
    done; True if one began."""
    exporter.step(scan=True)
    began = exporter._apply(DesiredState.model_validate(desired))
    exporter.reconciler.wait_idle()
    return began


class FakeCoordinator:
    """The coordinator's side of the exporter protocol, played by a test that needs an
    exporter process and the operations it runs, not the coordinator's rules.

    As strict as the real one where the exporter can tell: a heartbeat must be valid for the
    protocol's model and of this protocol version (422 / 409 otherwise, with the real one's
    error body), and its answer is the protocol's ``DesiredState``. Like the real one it keeps
    an operation in the desired state until a heartbeat it answered carried the operation's
    end. Long-polls are answered at once when the desired state changed, else after a while.
    """

    def __init__(self):
        self.heartbeats: list[Heartbeat] = []
        self.images: dict[str, bytes] = {}
        self._operations: list[DesiredOperation] = []
        self._services: list[DesiredService] = []
        self._version = 0
        self._changed = threading.Condition()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self._answer(*fake._heartbeat(body))

            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                if url.path.endswith("/desired"):
                    query = urllib.parse.parse_qs(url.query)
                    self._answer(200, fake._desired_after(query.get("etag", [""])[0]).model_dump_json())
                elif "/images/" in url.path and url.path.rsplit("/", 1)[1] in fake.images:
                    self._answer(200, fake.images[url.path.rsplit("/", 1)[1]], "application/octet-stream")
                else:
                    self._answer(404, json.dumps({"error": "unknown", "message": f"nothing at {url.path}"}))

            def _answer(self, status: int, body, content_type="application/json"):
                body = body.encode() if isinstance(body, str) else body
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the exporter hung up (it was killed, or stopped its long-poll): as a server sees it

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, name="fake-coordinator", daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ---- what the test does -----------------------------------------------------------------

    def begin(self, *operations: dict) -> None:
        """Put operations in the desired state (each a ``DesiredOperation``'s fields)."""
        with self._changed:
            self._operations += [DesiredOperation.model_validate(op) for op in operations]
            self._version += 1
            self._changed.notify_all()

    def serve(self, *services: dict) -> None:
        """Make these the services the exporter should run (each a ``DesiredService``'s fields)."""
        with self._changed:
            self._services = [DesiredService.model_validate(s) for s in services]
            self._version += 1
            self._changed.notify_all()

    def reports(self, op: str) -> list[tuple[str, OperationReport]]:
        """(boot id, report) of ``op`` in every heartbeat so far, oldest first."""
        with self._changed:
            return [(beat.boot_id, report) for beat in self.heartbeats for report in beat.operations if report.op == op]

    def last(self, op: str) -> OperationReport | None:
        reports = self.reports(op)
        return reports[-1][1] if reports else None

    def ended(self, op: str) -> OperationReport | None:
        """The report that carried ``op``'s end, if one came."""
        return next((report for _, report in self.reports(op) if report.state != "running"), None)

    # ---- what the exporter calls ----------------------------------------------------------------

    def _state(self) -> DesiredState:
        return DesiredState(services=self._services, operations=self._operations, etag=f"e{self._version}",
                            as_of=time.time())

    def _heartbeat(self, body: bytes) -> tuple[int, str]:
        try:
            beat = Heartbeat.model_validate_json(body)
        except ValidationError as exc:
            return 422, json.dumps({"error": "invalid", "message": str(exc)})
        if beat.protocol != PROTOCOL_VERSION:
            return 409, json.dumps({"error": "protocol", "message": f"protocol {beat.protocol}, not {PROTOCOL_VERSION}"})
        with self._changed:
            self.heartbeats.append(beat)
            ended = {r.op for r in beat.operations if r.state != "running"}
            if any(op.op in ended for op in self._operations):
                self._operations = [op for op in self._operations if op.op not in ended]
                self._version += 1
                self._changed.notify_all()
            return 200, self._state().model_dump_json()

    def _desired_after(self, etag: str) -> DesiredState:
        with self._changed:
            self._changed.wait_for(lambda: etag != f"e{self._version}", LONG_POLL_CAP_S)
            return self._state()
