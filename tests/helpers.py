"""Small helpers for talking to a lab, its boards and its processes in tests."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import WAIT_S, wait_for
import zygote


def device(coordinator, name):
    """The coordinator's row of device ``name``."""
    return coordinator.api(f"/devices/{name}").json()


def wait_state(coordinator, name, state, timeout=WAIT_S):
    """Wait until device ``name`` is in ``state`` (``timeout``: as ``wait_for``'s); one that never
    gets there fails saying where it is."""
    seen: dict = {}

    def there() -> bool:
        seen.update(device(coordinator, name))
        return seen.get("state") == state
    try:
        wait_for(there, timeout, what=f"{name} {state}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; it is {seen.get('state')} ({seen.get('reason') or 'no reason'}, "
                             f"health {seen.get('health')}, quarantine {seen.get('quarantine')})") from None


def reserve(coordinator, name, ttl_s=600):
    """Reserve device ``name`` through the API: the new lease (pending or active)."""
    response = coordinator.api("/leases", "POST", json={"device": name, "ttl_s": ttl_s})
    assert response.status_code == 201, response.text
    return response.json()


def wait_active(coordinator, lease_id):
    """Wait until lease ``lease_id`` is ready (for ``wait_for``'s safety net at most): the lease."""
    def active():
        lease = coordinator.api(f"/leases/{lease_id}", params={"wait": 5, "unless": "pending"}).json()
        return lease if lease["ready"] else None
    return wait_for(active, what=f"{lease_id} ready")


def written_cdi_spec(folder: Path, host: str, lease_id: str) -> Path:
    """The CDI spec of lease ``lease_id`` in ``folder``, once its exporter wrote it: a service's
    environment is asked off the way to ready (docs/architecture.md, "Containers and CDI"), so
    the spec of a lease just ready may come a moment later."""
    path = folder / f"device-loop_{host}_{lease_id}.json"
    wait_for(path.exists, what=f"the CDI spec of {lease_id} written")
    return path


def raw_endpoint(lease):
    """The lease's raw TCP endpoint."""
    return next(e for e in lease["endpoints"] if e["protocol"] == "raw")


def run_cli(env, url, *args, check=True):
    """``device-loop --coordinator URL ARGS`` with this interpreter: the finished process
    (asserted to succeed unless ``check`` is false)."""
    result = zygote.run(["--coordinator", url, *args], env, timeout=WAIT_S)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def read_until(sock: socket.socket, expect: bytes, timeout: float = WAIT_S) -> bytes:
    """Read ``sock`` until ``expect`` shows up (asserted), for ``timeout`` seconds at most."""
    received, deadline = b"", time.monotonic() + timeout
    while expect not in received:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(4096)
        except socket.timeout:
            break
        if not chunk:
            break
        received += chunk
    assert expect in received, f"expected {expect!r}, the board said {received!r}"
    return received


def uart_exchange(host: str, port: int, send: bytes, expect: bytes, timeout: float = WAIT_S) -> bytes:
    """Send ``send`` over a raw TCP endpoint and read until ``expect`` shows up."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(send)
        return read_until(sock, expect, timeout)


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def recorded_pids(state_dir: Path) -> dict[int, dict]:
    """The service processes an exporter recorded in its state folder."""
    records = {}
    for path in (Path(state_dir) / "processes").glob("*.json"):
        record = json.loads(path.read_text())
        records[record["pid"]] = record
    return records


def processes_with(text: str) -> list[int]:
    """Pids whose command line contains ``text``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    if pid_alive(int(proc.name)):
                        pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def spawned_by(state_dir: Path) -> set[int]:
    """Live processes whose environment says the process registry of an exporter with
    ``state_dir`` started them: recorded or not, whichever run of it started them."""
    from device_loop.core.process import SPAWNED_BY

    mark = f"{SPAWNED_BY}={Path(state_dir) / 'processes'}".encode()
    pids = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if mark in (proc / "environ").read_bytes().split(b"\0") and pid_alive(int(proc.name)):
                    pids.add(int(proc.name))
            except OSError:
                continue
    return pids


def kill_spawned(state_dir: Path) -> None:
    """SIGKILL whatever an exporter with ``state_dir`` started and left running (for a
    test's teardown, after a failure: each is the leader of its own process group)."""
    for pid in spawned_by(state_dir):
        try:
            os.killpg(pid, 9)
        except OSError:
            pass


def write_clip(path: Path) -> Path:
    """A one-second MJPEG clip at ``path``: a 160x120 screen going from black to white."""
    import cv2
    import numpy as np

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (160, 120))
    for shade in range(0, 250, 25):
        writer.write(np.full((120, 160, 3), shade, np.uint8))
    writer.release()
    return path


def unused_uids(count: int) -> list[int]:
    """Uids no account has and no process runs as: each job's account in a test of its own
    (tests run side by side, and two sharing an account could read each other)."""
    import pwd
    import random

    taken = {entry.pw_uid for entry in pwd.getpwall()}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                taken.add(entry.stat().st_uid)
    free = [uid for uid in range(61000, 65000) if uid not in taken]
    return random.sample(free, count)


def open_folder(prefix: str) -> Path:
    """A new folder every account may enter, and write in (sticky, as /tmp): the tests'
    own tmp_path is root's alone."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o1777)
    return folder


def importable_by_anyone(folder: Path) -> tuple[str, str]:
    """(a Python, the first lines of a program it runs) for an account other than root to
    import this project and its packages. This venv's Python may lie in a folder only root
    enters (pyenv under /root), and the checkout with its venv too (a clone in a ``mktemp -d``
    folder, as CI makes): so it is the system's Python of the same version, with this venv's
    packages and the project's source linked into ``folder`` (hard links: no byte copied
    where they share a file system). Run it with ``-I -S``."""
    import site

    python = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    assert Path(python).exists(), f"the tests run commands as other accounts with {python}: install it"
    checkout = Path(__file__).resolve().parent.parent
    source = folder / "device-loop-source"
    source.mkdir()
    packages = []
    for n, where in enumerate(p for p in site.getsitepackages() if Path(p).is_dir()):
        packages.append(str(_linked(Path(where), source / f"site-{n}")))
    for part in ("device_loop", "core", "coordinator", "exporter", "client", "cli", "plugins"):
        _linked(checkout / part, source / part)  # (device_loop/ links to the others: ../core...)
    # its folders are its own (a link's file is the venv's: its mode stays as pip made it, readable)
    subprocess.run(["find", str(source), "-type", "d", "-exec", "chmod", "a+rx", "{}", "+"], check=True)
    prologue = (f"import site, sys\nfor folder in {json.dumps(packages)}: site.addsitedir(folder)\n"
                f"sys.path.insert(0, {json.dumps(str(source))})\n")
    return python, prologue


def device_loop_for_anyone(folder: Path) -> Path:
    """A ``device-loop`` command (written in ``folder``) that an account other than root can
    run (``importable_by_anyone``)."""
    python, prologue = importable_by_anyone(folder)
    script = folder / "device-loop"
    script.write_text("#!/bin/sh\n"
                      f"exec {python} -I -S -c '{prologue}"
                      "from device_loop.cli.main import main\n"
                      "sys.argv[0] = \"device-loop\"\n"
                      "sys.exit(main())' \"$@\"\n")
    script.chmod(0o755)
    return script


def _linked(tree: Path, to: Path) -> Path:
    """``tree`` as ``to``: hard links, else (another file system) a copy."""
    if subprocess.run(["cp", "-al", str(tree), str(to)], capture_output=True).returncode != 0:
        import shutil

        shutil.rmtree(to, ignore_errors=True)
        subprocess.run(["cp", "-a", str(tree), str(to)], check=True)
    return to


@contextlib.contextmanager
def token_lab(tmp_path: Path, env: dict, devices: list[dict], *users: str, scopes: dict | None = None):
    """A lab with tokens, its endpoints gated: ``(coordinator, exporter, {user: env with that
    user's token})``, every device of ``devices`` idle; both stopped at the end. ``scopes``:
    user -> its token's ``TokenScope``."""
    from conftest import Coordinator, Exporter, lab_tokens

    coordinator = Coordinator(tmp_path, env, extra=())
    exporter = None
    try:
        made, token_file = lab_tokens(env, coordinator, tmp_path, *users, scopes=scopes)
        exporter = Exporter(tmp_path, env, coordinator.url, devices, token_file=str(token_file))
        for name in (d["name"] for d in devices):
            wait_for(lambda name=name: coordinator.api(f"/devices/{name}", headers={}).json().get("state") == "idle",
                     what=f"{name} idle")
        yield coordinator, exporter, {user: {**env, "DEVICE_LOOP_TOKEN": token} for user, token in made.items()}
    finally:
        if exporter is not None:
            exporter.stop()
        coordinator.stop()


class Piped:
    """``device-loop ARGS`` in a process of its own (forked from the zygote) as much of a
    ``subprocess.Popen`` as the tests use: its standard input ``stdin`` (None: /dev/null), its
    standard output and error the descriptors ``stdout`` and ``stderr`` where given, else pipes
    read through ``.stdout`` and ``.stderr`` (bytes). ``close()`` kills it if it still runs."""

    def __init__(self, argv: list[str], env, stdin: int | None = None, stdout: int | None = None,
                 stderr: int | None = None):
        out_read, out_write = os.pipe() if stdout is None else (None, stdout)
        err_read, err_write = os.pipe() if stderr is None else (None, stderr)
        try:
            self.process = zygote.popen(argv, env, stdin=stdin, stdout=out_write, stderr=err_write)
        finally:
            for read, write in ((out_read, out_write), (err_read, err_write)):
                if read is not None:
                    os.close(write)
        self.stdout = open(out_read, "rb") if out_read is not None else None
        self.stderr = open(err_read, "rb") if err_read is not None else None

    def __getattr__(self, name: str):  # poll, wait, send_signal, kill, pid, returncode
        return getattr(self.process, name)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(WAIT_S)
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
