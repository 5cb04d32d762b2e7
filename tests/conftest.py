"""Shared fixtures: real coordinator and exporter processes on free ports."""
from __future__ import annotations

import asyncio
import contextlib
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import httpx2
import pytest
import serial
import tomli_w

from device_loop.client import http as client_http
from device_loop.core.plugins import ENTRY_POINT_GROUP, LOAD_ENV
from device_loop.core.ports import free_port, wait_port_open
from device_loop.exporter import config as exporter_config
from podman_lab import podman, podman_names  # noqa: F401  (fixtures: podman, one busybox image a session)
import areas
import zygote

# At the end of a run nothing it started is alive (tests/leftovers.py)
pytest_plugins = ["leftovers"]

SRC = Path(__file__).resolve().parent.parent
# A plugin someone installed into this venv (the example's README suggests it) must not
# change what the tests see: they load the built-in plugins, and name any other they use.
BUILT_IN_PLUGINS = ",".join(sorted(e.name for e in entry_points(group=ENTRY_POINT_GROUP)
                                   if e.value.startswith("device_loop.plugins.")))
os.environ[LOAD_ENV] = BUILT_IN_PLUGINS
# every process a test starts is unbuffered (own_environment), and a zygote forks only a process
# whose interpreter settings are its own, which are this process's: without this line, where the
# shell running ./lab test had not set it (CI), each of them was a Python start of its own
os.environ["PYTHONUNBUFFERED"] = "1"


def _process_with_port(port: int) -> str:
    """The process of this machine with a TCP socket on local ``port``: its pid and command."""
    sockets = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    sockets.add(f"socket:[{fields[9]}]")
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        with contextlib.suppress(OSError):
            if os.readlink(fd) in sockets:
                command = Path("/proc", fd.parts[2], "cmdline").read_bytes().replace(b"\0", b" ")
                return f"pid {fd.parts[2]}: {command.decode(errors='replace').strip()}"
    return f"a process that has exited since (its port was {port})"


class DefaultCoordinatorGuard:
    """What the default coordinator URL of every entry point (the exporter config's, the
    CLI's, ``Lab()``'s) points at while the tests run, instead of http://127.0.0.1:7420,
    where the lab of whoever runs the tests may listen: a port of ours that resets every
    connection, as a closed port refuses it, and notes which process made it."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.server.setblocking(False)
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.lock = threading.Lock()
        self.seen: list[str] = []
        threading.Thread(target=self._watch, name="default-coordinator-guard", daemon=True).start()

    def _watch(self) -> None:
        while True:
            select.select([self.server], [], [])
            self._accept_waiting()

    def _accept_waiting(self) -> None:
        with self.lock:
            while True:
                try:
                    connection, (_, port) = self.server.accept()
                except BlockingIOError:
                    return
                self.seen.append(_process_with_port(port))
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset
                connection.close()

    def take(self) -> list[str]:
        """Who connected since the last call, including connections still waiting to be
        accepted (the kernel completes them whether or not the watcher has run)."""
        self._accept_waiting()
        with self.lock:
            seen, self.seen = self.seen, []
        return seen


DEFAULT_COORDINATOR_GUARD = DefaultCoordinatorGuard()
os.environ["DEVICE_LOOP_COORDINATOR"] = DEFAULT_COORDINATOR_GUARD.url  # read first by every entry point
exporter_config.DEFAULT_COORDINATOR = client_http.DEFAULT_URL = DEFAULT_COORDINATOR_GUARD.url  # (if unset)


@pytest.fixture(autouse=True)
def nothing_reaches_the_default_coordinator():
    """Fail the test during which (or just before which) anything connected to the default coordinator URL."""
    yield
    reached = DEFAULT_COORDINATOR_GUARD.take()
    if reached:
        pytest.fail("something reached the default coordinator URL, which stands in for http://127.0.0.1:7420 (the "
                    "lab of whoever runs the tests): give every coordinator, exporter and client of a test its own "
                    "URL\n  " + "\n  ".join(reached), pytrace=False)


# The longest tests, longest first (measured in a full ./lab test run from a fresh clone while
# other runs shared the two cores: the VM lab module some 160 s, the podman test 94 s,
# schemathesis 89 s and 42 s, mypy 70 s, the hand-booted guests 60 s, a lab with tokens 60 s,
# ...): dealt out in turn, one share at the head of each worker's first batch
# (tests/scheduling.py), so that none is left for the run's end. A name part of a test's id; a
# kept-together module's is its file's.
LONGEST_FIRST = ("test_qemu_lab.py::", "test_openapi.py::test_schemathesis",
                 "test_static_checks.py::test_mypy", "test_qemu_guest.py::", "test_tokens_end_to_end.py::test_a_lab",
                 "test_up_vms.py::test_up_with_qemu", "test_ab_sim.py::test_abab",
                 "test_new_user_c.py::test_a_board_its_holder_switched_off",
                 "test_live_properties.py::test_the_lease_rules", "test_shared_worker.py::test_running_another",
                 "test_faults.py::test_acknowledged", "test_ticket_properties.py::test_tickets_are",
                 "test_lease_properties.py::")
# Modules whose tests share a costly module fixture (VMs booted under TCG, CPU-bound): never
# split between workers, which would each boot them again.
KEPT_TOGETHER = ("test_qemu_lab.py", "test_qemu_guest.py")  # file names


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist worksteal`` (what ./lab test runs) with the suite's two rules (tests/scheduling.py)."""
    if config.getvalue("dist") != "worksteal":
        return None
    from scheduling import SuiteStealing
    return SuiteStealing(config, log, longest=LONGEST_FIRST, kept=KEPT_TOGETHER)


# The fast tier (`./lab test --fast`: `-m "not service"`) runs the tests that start no
# process and use no PostgreSQL. A test using one of these fixtures (or one built on them),
# or the database fixture's PostgreSQL half, is marked `service` here; a module whose tests
# start processes themselves says so (`pytestmark = [pytest.mark.service, ...]`). A test not
# marked that starts a process fails (only_a_service_test_starts_a_process).
SERVICE_FIXTURES = {"coordinator", "exporters", "postgres_database", "pty_pair", "display", "browser"}


def pytest_configure(config):
    # a run started in the background of a non-interactive shell (`./lab test &`) inherits SIGINT
    # and SIGQUIT ignored, and so would each process a test starts: its Ctrl-C would reach nothing
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    for area, what in areas.all_areas().items():
        config.addinivalue_line("markers", f"{area}: a test of {what} (tests/areas.py; ./lab test --area {area})")


@pytest.hookimpl(tryfirst=True)  # (before -m deselects by marker)
def pytest_collection_modifyitems(session, config, items):
    # the areas read every test module's imports (a CPU-second a collection, and each worker
    # collects): marked only where a run selects by marker (./lab test --area, --fast)
    by_marker = bool(config.option.markexpr)
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        on_postgresql = getattr(item, "callspec", None) and item.callspec.params.get("database") == "postgresql"
        if on_postgresql or SERVICE_FIXTURES & fixtures:
            item.add_marker(pytest.mark.service)
        for area in areas.item_areas(Path(item.path), fixtures) if by_marker else ():
            item.add_marker(area)


def stale_install(environ: dict | None = None) -> str | None:
    """Why the venv's install of device-loop is not this checkout's, or None. The processes a
    lab starts import the package as installed (``python -P -m device_loop...``: not from the
    current folder), and the plugins are its entry points: an editable install left pointing
    at another (or a deleted) checkout runs other code there, or none, and a test times out."""
    declared = tomllib.loads((SRC / "pyproject.toml").read_text())["project"]["entry-points"][ENTRY_POINT_GROUP]
    installed = {e.name: e.value for e in entry_points(group=ENTRY_POINT_GROUP) if e.value.startswith("device_loop.")}
    if installed != declared:
        return (f"the installed entry points of {ENTRY_POINT_GROUP!r} are not pyproject.toml's: "
                f"{sorted(installed.items())} against {sorted(declared.items())}")
    where = "import device_loop, os; print(os.path.realpath(device_loop.__path__[0]))"
    probe = subprocess.run([sys.executable, "-P", "-c", where], cwd="/", env=environ, capture_output=True, text=True,
                           timeout=60)
    here = str((SRC / "device_loop").resolve())
    if probe.returncode != 0 or probe.stdout.strip() != here:
        return (f"a process started outside this folder imports device_loop from "
                f"{probe.stdout.strip() or probe.stderr.strip()[-300:]}, not {here}")
    return None


def pytest_sessionstart(session):
    if hasattr(session.config, "workerinput"):
        return  # (the controller checked)
    stale = stale_install()
    if stale:
        pytest.exit(f"{stale}: set PYTHONPATH={SRC}, or reinstall the venv from this checkout (./lab test does: "
                    f"{sys.executable} -m pip install -e '{SRC}[test]')", returncode=4)


def pytest_sessionfinish(session, exitstatus):
    zygote.Zygote.stop_mine()  # (and what it started: before leftovers.py looks for what is alive)
    reached = DEFAULT_COORDINATOR_GUARD.take()  # a process that outlived its test, say
    if reached:
        print("\nsomething reached the default coordinator URL after the last test:\n  " + "\n  ".join(reached))
        session.exitstatus = 1


INCIDENTAL_PROCESSES = {"ctypes.util"}  # find_library runs ldconfig -p, the first time a library is looked for


@pytest.fixture(autouse=True)
def only_a_service_test_starts_a_process(request, monkeypatch):
    """Fail a test not marked ``service`` that started a process: the fast tier would run it."""
    if request.node.get_closest_marker("service"):
        yield
        return
    started: list[str] = []
    execute_child = subprocess.Popen._execute_child

    def recorded(self, args, *rest, **kwargs):
        caller = sys._getframe(1)
        while caller and caller.f_globals.get("__name__") not in INCIDENTAL_PROCESSES:
            caller = caller.f_back
        if caller is None:  # (a library's own lookup, once a process, is no service of the test's)
            started.append(args if isinstance(args, (str, bytes)) else " ".join(map(str, args)))
        return execute_child(self, args, *rest, **kwargs)

    fork = zygote.Zygote.popen

    def forked(self, argv, *rest, **kwargs):
        started.append("device-loop " + " ".join(map(str, argv)))
        return fork(self, argv, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", recorded)
    monkeypatch.setattr(zygote.Zygote, "popen", forked)
    yield
    if started:
        pytest.fail("a test that starts a process is marked service (the fast tier leaves it out): it started "
                    + "; ".join(s[:200] for s in started), pytrace=False)


POSTGRES_ENV = "DEVICE_LOOP_TEST_POSTGRES"  # an admin URL; ./lab test starts a throwaway server and sets it


def postgres_admin_url() -> str:
    """The throwaway PostgreSQL server's admin URL; without one the test is skipped (in CI,
    where every database test runs on PostgreSQL too, it fails)."""
    admin = os.environ.get(POSTGRES_ENV)
    if not admin:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs every database test on PostgreSQL too, and {POSTGRES_ENV} is not set")
        pytest.skip(f"no PostgreSQL to test on ({POSTGRES_ENV}; ./lab test starts one)")
    return admin


#: The databases a test that takes ``database`` runs on, unless its module says ``DATABASES``.
BOTH_DATABASES = ("sqlite", "postgresql")
#: What a module of rules whose SQL is the same on both says (docs/architecture.md, "Testing").
SQLITE_ONLY = ("sqlite",)


def pytest_generate_tests(metafunc):
    chosen = any("database" in (m.args[0].split(",") if isinstance(m.args[0], str) else m.args[0])
                 for m in metafunc.definition.iter_markers("parametrize"))  # a test's own choice
    if "database" in metafunc.fixturenames and not chosen:
        metafunc.parametrize("database", getattr(metafunc.module, "DATABASES", BOTH_DATABASES), indirect=True)


@pytest.fixture
def database(request):
    """Run the test on SQLite, and again on PostgreSQL (unless its module's ``DATABASES`` says
    SQLite only): every in-process lab it makes then gets a database of its own on that
    server, which nobody else uses meanwhile and holds what the migrations leave, nothing
    else (lab_databases.py)."""
    import lab_in_process

    if request.param == "postgresql":
        lab_in_process.POSTGRES["admin_url"] = postgres_admin_url()
    try:
        yield request.param
    finally:
        lab_in_process.POSTGRES["admin_url"] = None


@pytest.fixture
def anyio_backend():
    return "asyncio"


def own_environment(folder: Path) -> dict[str, str]:
    """An environment of our own, as alice, in ``folder``: HOME and XDG dirs under ``folder/home``,
    nothing of the caller's device-loop settings (the default coordinator is the guard's)."""
    home = folder / "home"
    home.mkdir(exist_ok=True)
    from leftovers import MARK, RUN_TMP  # (here: imported first as pytest's plugin, its asserts rewritten)

    # (the run's mark stays: a process started from it is one the end of the run looks for; its
    # temporary files go in the run's folder, removed with the run)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEVICE_LOOP_") or k == MARK}
    environ.update(TMPDIR=os.environ[RUN_TMP], HOME=str(home), XDG_DATA_HOME=str(home / "data"),
                   XDG_STATE_HOME=str(home / "state"),
                   DEVICE_LOOP_USER="alice", DEVICE_LOOP_COORDINATOR=DEFAULT_COORDINATOR_GUARD.url,
                   PYTHONUNBUFFERED="1", **{LOAD_ENV: BUILT_IN_PLUGINS})
    return environ


@pytest.fixture
def env(tmp_path):
    """An environment of our own (``own_environment``) in the test's folder."""
    return own_environment(tmp_path)


class Proc:
    """A device-loop subprocess with its output in a file, stopped at teardown."""

    def __init__(self, args: list[str], env: dict, log: Path):
        self.args, self.env, self.log = args, env, log
        self.popen = None
        self.start()

    def start(self):
        with open(self.log, "ab") as out:  # (forked from this worker's zygote: tests/zygote.py)
            self.popen = zygote.popen(self.args, self.env, stdout=out.fileno(), stderr=out.fileno())

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig=signal.SIGTERM, timeout=None):
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(WAIT_S if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
                raise AssertionError(f"{self.args[0]} ignored {sig!r}:\n{self.output()[-3000:]}")
        return self.popen.returncode


#: The suite's one safety net for a wait (DEVICE_LOOP_TEST_WAIT_S overrides it): the default
#: timeout of every wait for something that should happen, which only ends a wait that would
#: otherwise hang; no wait's success depends on it, however busy the machine. Below a test's
#: own timeout (pytest-timeout's 120 s), so that a wait that hangs says what it waited for.
WAIT_S = float(os.environ.get("DEVICE_LOOP_TEST_WAIT_S") or 90)


def wait_for(predicate, timeout=WAIT_S, interval=0.05, what="condition"):
    """Call ``predicate`` until it returns something true, and return that. ``timeout``: the
    safety net ``WAIT_S`` (a wait follows progress, not a number found on an idle machine),
    or, where the test checks that something happens within a bound, a bound derived from
    the setting it checks (``1.5 * GRACE_S``), never a bare number (tests/test_suite_rules.py)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class Coordinator(Proc):
    """A coordinator process; in the single-user trust mode unless ``extra`` says otherwise."""

    def __init__(self, tmp_path: Path, env: dict, extra=("--single-user",)):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # a lease's services have the suite's safety net to come up (its default, 30 s, was
        # a number from a quiet machine); a test of the timeout sets its own (the last one counts)
        super().__init__(["coordinator", "--data-dir", str(tmp_path / "coord"), "--port", str(self.port),
                          "--allocating-timeout", f"{WAIT_S:g}s", *extra],
                         env, tmp_path / "coordinator.log")
        self.wait_ready()

    def wait_ready(self):
        def up():
            assert self.popen.poll() is None, f"coordinator exited:\n{self.output()}"
            try:
                return httpx2.get(f"{self.url}/api/v1/health", timeout=1, verify=False).status_code == 200
            except httpx2.HTTPError:
                return False
        wait_for(up, what="coordinator health")

    def api(self, path: str, method="GET", **kwargs):
        kwargs.setdefault("headers", {"X-Device-Loop-User": "alice"})
        # plain http: with no verify=False each call built a TLS context (23 ms of CPU; the suite's
        # waits poll through here thousands of times)
        return httpx2.request(method, f"{self.url}/api/v1{path}", timeout=10, verify=False, **kwargs)


HEARTBEAT_S = 1.0  # a test exporter's heartbeat period, unless the test sets one


class Exporter(Proc):
    def __init__(self, tmp_path: Path, env: dict, coordinator_url: str, devices: list[dict],
                 name="host-a", heartbeat_s=HEARTBEAT_S, plugins=None, **settings):
        # a test's lab sees a health change within a heartbeat, as it did before health had its own
        # schedule (docs/architecture.md, "Health that heals"); the schedule's own tests set theirs
        settings.setdefault("health_period", heartbeat_s)
        settings.setdefault("health_recheck", heartbeat_s / 2)
        config = {"exporter": {"name": name, "coordinator": coordinator_url, "heartbeat_s": heartbeat_s,
                               "state_dir": str(tmp_path / f"state-{name}"),
                               "cdi_dir": str(tmp_path / "cdi"), **settings},  # (a test's exporters share it, as a host's do)
                  "devices": devices}
        if plugins:
            config["plugins"] = plugins
        self.config_path = tmp_path / f"exporter-{name}.toml"
        self.config_path.write_text(tomli_w.dumps(config))
        self.state_dir = tmp_path / f"state-{name}"
        super().__init__(["exporter", "--config", str(self.config_path)], env, tmp_path / f"exporter-{name}.log")


@pytest.fixture
def exporters():
    """Exporters a test starts, stopped at its end."""
    started: list[Exporter] = []
    yield started
    for exporter in started:
        exporter.stop(signal.SIGKILL)


def lab_tokens(env: dict, coordinator: "Coordinator", folder: Path, *users: str,
               scopes: dict | None = None) -> tuple[dict, Path]:
    """Tokens made on the lab's database, as its first admin makes them (``device-loop admin
    token create --data-dir``, which tests/test_tokens_end_to_end.py runs; here the same
    function in this process, without a Python start a token): (user -> token, the token
    file of exporter ``host-a``, readable by its owner only). ``scopes``: user -> the
    ``TokenScope`` of that user's token."""
    from device_loop.coordinator.identity import issue_token
    from device_loop.coordinator.serve import sqlite_url
    from device_loop.coordinator.store import Store

    async def make() -> dict:
        store = Store(sqlite_url(folder / "coord"))
        await store.connect()
        try:
            made = {user: (await issue_token(store, time.time, user, scope=(scopes or {}).get(user)))["token"]
                    for user in users}
            made["host-a"] = (await issue_token(store, time.time, host="host-a"))["token"]
        finally:
            await store.disconnect()
        return made

    box: dict[str, dict] = {}  # (on a thread of its own: async tests call this inside their event loop)
    maker = threading.Thread(target=lambda: box.update(made=asyncio.run(make())))
    maker.start()
    maker.join(60)
    made = box["made"]
    token_file = folder / "exporter.token"
    token_file.write_text(made.pop("host-a"))
    token_file.chmod(0o600)
    return made, token_file


def sim_devices(*names):
    return [{"name": n, "plugin": "sim", "class": "sim-board"} for n in names]


@pytest.fixture
def coordinator(tmp_path, env):
    proc = Coordinator(tmp_path, env)
    yield proc
    proc.stop()


@pytest.fixture
def postgres_database():
    """A database of its own on the throwaway PostgreSQL server, at the latest migration (a
    coordinator opening it has nothing to migrate) and holding nothing else: one of this
    process's, reset, as an in-process lab's (lab_databases.take_migrated_database; one a
    process of an earlier test is still on is dropped, not reset): its URL."""
    import lab_databases

    admin = postgres_admin_url()
    name = asyncio.run(lab_databases.take_migrated_database(admin))
    yield lab_databases.database_url(admin, name)
    lab_databases.give_back(admin, name)  # (after the coordinators of the fixtures that use this one stopped)


@contextlib.contextmanager
def coordinator_pair(tmp_path, env, database_url: str, *extra: str):
    """Two coordinator processes in the trust mode on one PostgreSQL database (as behind a
    reverse proxy), with the options ``extra`` each."""
    procs = []
    try:
        for n in range(2):
            folder = tmp_path / f"c{n}"
            folder.mkdir()
            procs.append(Coordinator(folder, env, extra=("--single-user", "--database-url", database_url, *extra)))
        yield procs
    finally:
        for proc in procs:
            proc.stop()


@pytest.fixture
def two_coordinators(tmp_path, env, postgres_database):
    """Two coordinator processes on one PostgreSQL database (as behind a reverse proxy)."""
    with coordinator_pair(tmp_path, env, postgres_database) as procs:
        yield procs


@pytest.fixture
def exporter_factory(tmp_path, env, coordinator):
    started = []

    def start(devices=None, **kwargs):
        proc = Exporter(tmp_path, env, coordinator.url, devices or sim_devices("sim-board-0", "sim-board-1"), **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def echo_server():
    """A TCP 'console' that answers every line with 'console: LINE'."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            with conn:
                data = conn.recv(1024)
                conn.sendall(b"console: " + data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


class PtyPair:
    """``socat`` joining two ptys: the exporter serves ``board_side``; the test plays the
    board on ``far_side``. Pulling it out removes both links, as unplugging would."""

    def __init__(self, folder):
        self.board_side, self.far_side = folder / "ttyA", folder / "ttyB"
        self.proc = None
        self.plug()

    def plug(self):
        self.proc = subprocess.Popen(["socat", "pty,raw,echo=0,link=" + str(self.board_side),
                                      "pty,raw,echo=0,link=" + str(self.far_side)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: self.board_side.exists() and self.far_side.exists(), what="socat links")

    def unplug(self):
        self.proc.terminate()
        self.proc.wait(5)
        wait_for(lambda: not self.board_side.exists(), what="links gone")

    def far(self, timeout=3):
        return serial.Serial(str(self.far_side), 115200, timeout=timeout)


@pytest.fixture
def pty_pair(tmp_path):
    pair = PtyPair(tmp_path)
    yield pair
    if pair.proc.poll() is None:
        pair.unplug()


def uart_device(pty_pair, **settings):
    """The exporter config of ``jupiter``, a board on ``pty_pair`` served by the UART plugin."""
    return [{"name": "jupiter", "class": "riscv-sbc", "plugin": "uart", "path": str(pty_pair.board_side), **settings}]


class EchoBoard:
    """Plays a board on the far side of a pty pair that echoes each byte back."""

    def __init__(self, pair: PtyPair):
        self.port = pair.far(timeout=0.1)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                data = self.port.read(64)
            except (serial.SerialException, OSError):
                return
            if data:
                self.port.write(data)

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.port.close()


@pytest.fixture
def echo_board(pty_pair):
    board = EchoBoard(pty_pair)
    yield board
    board.close()


@pytest.fixture
def display():
    """A virtual display ``:N`` (Xvfb picks a free one), yielded as N."""
    read, write = os.pipe()
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(write), "-screen", "0", "640x480x24", "-nolisten", "tcp",
                             "-nolock"], pass_fds=(write,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(write)
    with os.fdopen(read) as said:
        number = said.readline().strip()
    yield number
    xvfb.terminate()
    xvfb.wait(10)


@pytest.fixture
def vnc_server(display):
    """x11vnc on the display: (its port, the display number)."""
    port = free_port()
    server = subprocess.Popen(["x11vnc", "-display", f":{display}", "-rfbport", str(port), "-localhost", "-nopw",
                               "-forever", "-shared", "-quiet", "-noxdamage"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_port_open("127.0.0.1", port, timeout=WAIT_S), "x11vnc did not start"
    yield port, display
    server.terminate()
    server.wait(10)


@pytest.fixture
def browser():
    """Debian's Chromium, driven by Playwright (never ``playwright install``). One a test: the
    sync API holds an event loop in its thread while it is open, which the worker's asyncio
    tests after it could not run beside."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", chromium_sandbox=False,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        yield BrowserWaitingUpToTheSafetyNet(chromium)
        chromium.close()


class BrowserWaitingUpToTheSafetyNet:
    """A Playwright browser whose contexts' waits (``wait_for_selector``, ``wait_for_function``,
    a click's wait for its element...) are bounded by the safety net, WAIT_S, as every wait of
    the suite is (Playwright's own default, 30 s, is a number found on an idle machine)."""

    def __init__(self, chromium):
        self.chromium = chromium

    def new_context(self, **options):
        context = self.chromium.new_context(**options)
        context.set_default_timeout(WAIT_S * 1000)
        return context

    def new_page(self, **options):
        return self.new_context(**options).new_page()


@pytest.fixture
def short_tmp():
    """A folder with a short path, for a VM slot's state folder: a VM's QMP socket lies deep in
    it, a unix socket's path has 107 bytes at most, and pytest's own folders are longer (the
    qemu plugin's health fails such a slot: docs/architecture.md, "Virtual devices")."""
    folder = Path(tempfile.mkdtemp(prefix="dl-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
