"""Running one command on a leased device (docs/architecture.md, "Running a command on a
device"): ``exec_on_lease(lease, command)`` -> ``ExecResult``, through the device's own channel.

The channel is chosen by the lease's endpoints, in this order:

- ``adb`` (an adb server): ``adb -H HOST -P PORT -s SERIAL shell CMD``; the shell protocol
  v2 returns the exit status, and stderr apart;
- ``ssh`` (the board's sshd, relayed by the exporter): ``ssh -p PORT -o BatchMode=yes ...
  USER@HOST CMD``, never an interactive question. Whom it logs in as, with which key, and
  which host key the board must show is ``ssh``: by default (a client on its user's
  machine) the endpoint's ``params.user``, the caller's own key (``identity_file``, else
  ``$DEVICE_LOOP_SSH_IDENTITY``, else ssh's own defaults and agent) and a host key pinned from
  the caller's own ``$DEVICE_LOOP_SSH_KNOWN_HOSTS`` (a known_hosts file naming devices), else
  from the endpoint's ``params.host_key``, else none (the path is the lease's own relay). An
  ``SshLogin`` (the coordinator's) says all three itself, from its own configuration, and
  nothing else of ssh's configuration counts; ``ssh=None`` takes no ssh at all;
- else the UART ``console``: a shell on a serial line, driven as labgrid's ShellDriver does.
  Ctrl-C and Enter, then a shell prompt must show within ``PROMPT_WAIT_S``; the command is
  sent as one line, ``echo START; sh -c 'CMD'; echo END $?``, with markers unique to the call
  (written split by quotes, so the line's own echo never matches them), and read until the
  end marker and its status, within the deadline. A shell of its own, as adb and ssh give,
  keeps what the command says (a ``#`` comment, an unclosed quote, ``exit``) from swallowing
  the end marker or ending the console's shell. A command
  that outlives its deadline is interrupted (Ctrl-C) and the prompt waited for, so the
  console stays usable. A console merges stderr into stdout, as a terminal shows them.

Gated endpoints (each with its gate's ``secret``) are reached past the lease gate: a console's
raw socket speaks the handshake itself, adb and ssh connect through a ``LocalForward`` that
lives for the call. Synchronous and thread-safe: the CLI and the Python client call it
directly, the coordinator's MCP ``exec`` through ``asyncio.to_thread``. It imports nothing
heavy (no pydantic): ``device-loop exec`` starts for every command a job runs.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import selectors
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Mapping

from .errors import ErrorCode
from .process import last_lines
from .ssh_keys import LOGIN_NAME_PATTERN
from .vocabulary import EndpointRole

Channel = Literal["adb", "ssh", "console"]
#: What a device that is switched off fails with: said as that (the lease knows who switched it off)
_UNANSWERED = (ErrorCode.NO_CHANNEL, ErrorCode.NO_PROMPT, ErrorCode.UNREACHABLE)
#: The errors that are the lab's, not the command's (docs/architecture.md, "Lab failures"): the
#: device did not answer, or a person switched it off. ``device-loop exec`` exits 75 on them.
LAB_EXEC_ERRORS = frozenset({*_UNANSWERED, ErrorCode.SWITCHED_OFF})

#: What one command may be, in bytes (a console's line must also fit the kernel's tty line
#: buffer, 4095 bytes in canonical mode, once wrapped in its markers).
MAX_COMMAND_BYTES = 4000
MAX_CONSOLE_LINE_BYTES = 4090
DEFAULT_MAX_OUTPUT = 1 << 20
MAX_TIMEOUT_S = 7 * 86400.0
#: How long a console has to show its prompt after Ctrl-C and Enter.
PROMPT_WAIT_S = 3.0
#: How long a console stays quiet after a prompt before the command is sent (the prompts of
#: Ctrl-C and of Enter both come).
QUIET_S = 0.05
CONNECT_TIMEOUT_S = 10.0
IDENTITY_ENV = "DEVICE_LOOP_SSH_IDENTITY"
#: A known_hosts file of the caller's own, by device name (``vm-1 ssh-ed25519 AAAA...``): its
#: pins are taken instead of those an endpoint reports
KNOWN_HOSTS_ENV = "DEVICE_LOOP_SSH_KNOWN_HOSTS"
#: ``exec_on_lease``'s ``ssh`` for a client: log in as the endpoint says, with the caller's own key
AS_REPORTED: Literal["as-reported"] = "as-reported"
INTERRUPT = b"\x03"
ENTER = b"\r"  # what a terminal sends for Enter (a tty's ICRNL makes it a newline)
#: A shell prompt's end: ``#``, ``$``, ``%`` or ``>``, and maybe a space (escape sequences removed).
_PROMPT_END = re.compile(r"[#$%>]\s?$")
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\x1b[=>]")
#: What adb and ssh print of their own failures (a command's own stderr rarely looks so).
_ADB_FAILED = re.compile(r"^(adb: )?error: |^\* daemon |^adb: (device|failed|unable)", re.M)
_SSH_FAILED = re.compile(r"^(ssh: |kex_exchange_identification|.*(Permission denied \(|Host key verification failed|"
                         r"Connection (closed|reset|refused|timed out)|IDENTIFICATION HAS CHANGED|Unable to negotiate|"
                         r"Load key|Bad owner|no such identity|Could not resolve))", re.M)
_LINE_CONTROL = re.compile(r"[\x01-\x08\x0b-\x1f\x7f]")  # a terminal's line discipline acts on these
_SSH_USER = re.compile(LOGIN_NAME_PATTERN)


@dataclass(frozen=True)
class ExecResult:
    """What a command printed and its exit status. On a ``console`` channel stderr is merged
    into stdout (a serial line carries one stream) and ``stderr`` is empty. ``truncated``:
    the output went past ``max_output`` and was cut there (what was cut is said in ``stderr``)."""
    stdout: str
    stderr: str
    status: int
    channel: Channel
    elapsed_s: float
    truncated: bool = False


@dataclass(frozen=True)
class SshLogin:
    """A login to a board's sshd as the caller's own configuration says it (the coordinator's
    ``--ssh-logins``): whom as, with which private key file, and the host key (``TYPE
    BASE64``) the board must show. Nothing of it comes from what an exporter reports."""
    user: str
    identity: str
    host_key: str


class ExecError(Exception):
    """A command that could not be run, or did not end: ``code`` says which (``no_channel``,
    ``no_login``, ``no_prompt``, ``timeout``, ``unreachable``, ``too_large``, ``bad_command``,
    ``switched_off``: a person switched the device off), ``message`` in words; ``output``, what
    it printed before a timeout."""

    def __init__(self, code: ErrorCode, message: str, output: str = ""):
        super().__init__(message)
        self.code, self.message, self.output = code, message, output


def exec_on_lease(lease: Mapping[str, Any], command: str, timeout_s: float = 60.0, *,
                  identity_file: str | None = None, max_output: int = DEFAULT_MAX_OUTPUT,
                  ssh: SshLogin | Literal["as-reported"] | None = AS_REPORTED) -> ExecResult:
    """Run ``command`` (a shell command line) on the device of ``lease`` (a lease as the
    coordinator answers it), through its adb, else ssh, else console endpoint; its output
    and status, or ``ExecError``. ``timeout_s`` bounds the command, ``max_output`` what is
    kept of each of stdout and stderr. ``ssh``: how to log in to the board's sshd
    (``AS_REPORTED``, an ``SshLogin``, or None: not at all, its console is taken instead)."""
    try:
        return _exec_on_lease(lease, command, timeout_s, identity_file, max_output, ssh)
    except ExecError as exc:
        off = lease.get("switched_off")
        if off and exc.code in _UNANSWERED:  # (not a missing file or a silent console: the board is off)
            raise ExecError(ErrorCode.SWITCHED_OFF, f"{lease.get('device', 'the device')} is {off}") from None
        raise


def _exec_on_lease(lease: Mapping[str, Any], command: str, timeout_s: float, identity_file: str | None,
                   max_output: int, ssh: SshLogin | Literal["as-reported"] | None) -> ExecResult:
    began = time.monotonic()
    _check_command(command)
    timeout_s = float(timeout_s)
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ExecError(ErrorCode.BAD_COMMAND, f"the timeout must be a positive number of seconds up to "
                                               f"{MAX_TIMEOUT_S:g}, not {timeout_s!r}")
    device = str(lease.get("device", "the device"))
    if not lease.get("ready"):
        raise ExecError(ErrorCode.NO_CHANNEL, f"{device} is not ready: {lease.get('reason') or lease.get('state')}")
    endpoints = list(lease.get("endpoints") or [])
    run: Callable[[], tuple[str, str, int, bool]]
    if endpoint := _first(endpoints, EndpointRole.ADB):
        channel: Channel = "adb"
        run = functools.partial(_adb, endpoint, endpoint.get("secret"), device, command, timeout_s, max_output)
    elif (endpoint := _first(endpoints, EndpointRole.SSH)) and ssh is not None:
        channel = "ssh"
        run = functools.partial(_ssh, endpoint, endpoint.get("secret"), device, command, timeout_s, max_output,
                                identity_file, ssh)
    elif consoles := [e for e in endpoints if e.get("role") == EndpointRole.CONSOLE]:
        channel = "console"
        console = sorted(consoles, key=lambda e: e.get("protocol") != "raw")[0]  # a plain socket first
        run = lambda: _console(console, console.get("secret"), device, command, timeout_s, max_output)  # noqa: E731
    elif endpoint:
        raise ExecError(ErrorCode.NO_LOGIN, f"{device} is reached through ssh, and no ssh login to it is configured "
                                            f"here")
    elif withheld := [part for part in ("adb", "ssh", "uart") if part in (lease.get("withheld") or ())]:
        raise ExecError(ErrorCode.OUT_OF_SCOPE, f"{device}'s {', '.join(withheld)} is not shown to this token: its "
                                                f"scope does not name {' or '.join(withheld)}, which a command run "
                                                f"from here goes through")
    else:
        raise ExecError(ErrorCode.NO_CHANNEL, f"{device} has no adb, ssh or console endpoint to run a command through "
                                              f"(its endpoints: {', '.join(_roles(endpoints)) or 'none'})")
    stdout, stderr, status, truncated = run()
    # (to a tenth of a millisecond, rounded down: never more than the time it took)
    return ExecResult(stdout, stderr, status, channel, math.floor((time.monotonic() - began) * 1e4) / 1e4, truncated)


def _check_command(command: str) -> None:
    if not isinstance(command, str) or not command.strip():
        raise ExecError(ErrorCode.BAD_COMMAND, "give a command to run")
    if "\0" in command:
        raise ExecError(ErrorCode.BAD_COMMAND, "a command cannot hold a NUL character")
    size = len(command.encode())
    if size > MAX_COMMAND_BYTES:
        raise ExecError(ErrorCode.TOO_LARGE, f"the command is {size} bytes; at most {MAX_COMMAND_BYTES} go at once "
                                             "(push a script to the device and run that)")


def _first(endpoints: list[Mapping[str, Any]], role: str) -> Mapping[str, Any] | None:
    return next((e for e in endpoints if e.get("role") == role), None)


def _roles(endpoints: list[Mapping[str, Any]]) -> list[str]:
    return [str(e.get("role") or e.get("kind")) for e in endpoints]


def _cut_note(stream: str, limit: int) -> str:
    return f"device-loop: {stream} cut at {limit} bytes (max_output)\n"


# ---- adb and ssh: a client program of their own ---------------------------------------------

@contextlib.contextmanager
def _reachable(endpoint: Mapping[str, Any], secret: str | None, device: str, what: str) -> Iterator[tuple[str, int]]:
    """``(host, port)`` to point a client program at: the endpoint, or a local port past its
    gate for the while. A port that refuses is said at once (adb would start a server of its
    own on a local port nobody listens on)."""
    host, port = str(endpoint.get("host")), int(endpoint.get("port", 0))
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ExecError(ErrorCode.UNREACHABLE, f"cannot reach {device}'s {what} at {host}:{port}: "
                                               f"{exc.strerror or exc}") from None
    if not secret:
        yield host, port
        return
    from .gate import LocalForward  # (asyncio: only where a gate is)

    with LocalForward(endpoint, secret) as forward:
        yield forward.endpoint["host"], forward.endpoint["port"]


def _adb(endpoint: Mapping[str, Any], secret: str | None, device: str, command: str, timeout_s: float,
         max_output: int) -> tuple[str, str, int, bool]:
    if shutil.which("adb") is None:
        raise ExecError(ErrorCode.NO_CHANNEL, f"{device} is reached through adb, which is not installed here "
                                              "(Debian: apt-get install adb)")
    serial = str((endpoint.get("params") or {}).get("serial", ""))
    with _reachable(endpoint, secret, device, "adb server") as (host, port):
        argv = ["adb", "-H", host, "-P", str(port), *(["-s", serial] if serial else []), "shell", "--", command]
        stdout, stderr, status, truncated = _run_client(argv, timeout_s, max_output, device, "adb")
    if status != 0 and not stdout and _ADB_FAILED.search(stderr):
        raise ExecError(ErrorCode.UNREACHABLE, f"adb could not run the command on {device}: {last_lines(stderr)}")
    return stdout, stderr, status, truncated


def _ssh(endpoint: Mapping[str, Any], secret: str | None, device: str, command: str, timeout_s: float,
         max_output: int, identity_file: str | None, ssh: SshLogin | str) -> tuple[str, str, int, bool]:
    if shutil.which("ssh") is None:
        raise ExecError(ErrorCode.NO_CHANNEL, f"{device} is reached through ssh, which is not installed here "
                                              "(Debian: apt-get install openssh-client)")
    with contextlib.ExitStack() as stack:
        options = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(CONNECT_TIMEOUT_S)}", "-o", "LogLevel=ERROR",
                   "-o", "GlobalKnownHostsFile=/dev/null"]
        if isinstance(ssh, SshLogin):
            user = ssh.user
            options = ["-F", "/dev/null", *options, *_pinned(stack, device, ssh.host_key), *_OWN_LOGIN_ONLY,
                       "-i", ssh.identity]
        else:
            user, options = _as_reported(stack, endpoint, device, identity_file, options)
        host, port = stack.enter_context(_reachable(endpoint, secret, device, "sshd"))
        where = f"{user}@{host}" if user else host
        argv = ["ssh", "-p", str(port), *options, "-T", "--", where, command]
        stdout, stderr, status, truncated = _run_client(argv, timeout_s, max_output, device, "ssh")
    if status == 255 and _SSH_FAILED.search(stderr):
        raise ExecError(ErrorCode.UNREACHABLE, f"ssh to {device} failed: {last_lines(stderr)}")
    return stdout, stderr, status, truncated


#: An ``SshLogin``'s key and no other credential: no agent, no password, nothing forwarded to the board
_OWN_LOGIN_ONLY = ["-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none", "-o", "PasswordAuthentication=no",
                   "-o", "KbdInteractiveAuthentication=no", "-o", "ForwardAgent=no", "-o", "ForwardX11=no",
                   "-o", "ClearAllForwardings=yes", "-o", "UpdateHostKeys=no"]


def _pinned(stack: contextlib.ExitStack, device: str, host_key: str) -> list[str]:
    """ssh's options that take ``host_key`` and no other, whatever port the relay or a forward has."""
    import tempfile

    known = stack.enter_context(tempfile.NamedTemporaryFile("w", prefix="devloop-known-", suffix=".hosts"))
    alias = f"device-loop-{device}"
    known.write(f"{alias} {host_key}\n")
    known.flush()
    return ["-o", f"HostKeyAlias={alias}", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known.name}"]


def _as_reported(stack: contextlib.ExitStack, endpoint: Mapping[str, Any], device: str, identity_file: str | None,
                 options: list[str]) -> tuple[str, list[str]]:
    """A client's login: the user the endpoint names, the caller's own key, and the host key
    of the caller's own known_hosts (``$DEVICE_LOOP_SSH_KNOWN_HOSTS``), else the endpoint's."""
    params = endpoint.get("params") or {}
    user, host_key = str(params.get("user") or ""), str(params.get("host_key") or "")
    if user and not _SSH_USER.match(user):  # an exporter's text: never an option of ssh (-oProxyCommand=...)
        raise ExecError(ErrorCode.UNREACHABLE, f"{device}'s ssh endpoint names a user that is not a login name")
    own_pins = os.environ.get(KNOWN_HOSTS_ENV)
    if own_pins:  # the caller's: by the device's name, strictly (a device it does not name is refused)
        options = [*options, "-o", f"HostKeyAlias={device}", "-o", "StrictHostKeyChecking=yes",
                   "-o", f"UserKnownHostsFile={own_pins}"]
    elif host_key:
        options = [*options, *_pinned(stack, device, host_key)]
    else:  # nothing to pin: the lease's relay is the path, and the user's known_hosts stays as it is
        options = [*options, "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    identity = identity_file or os.environ.get(IDENTITY_ENV) or None
    if identity:
        options += ["-i", identity, "-o", "IdentitiesOnly=yes"]
    return user, options


def _run_client(argv: list[str], timeout_s: float, max_output: int, device: str,
                what: str) -> tuple[str, str, int, bool]:
    """Run a client program to its end within ``timeout_s``: (stdout, stderr, status, cut).
    Each stream keeps ``max_output`` bytes; the rest is read and dropped."""
    deadline = time.monotonic() + timeout_s
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    kept = {"stdout": bytearray(), "stderr": bytearray()}
    cut = set()
    with selectors.DefaultSelector() as selector:
        assert proc.stdout is not None and proc.stderr is not None
        selector.register(proc.stdout, selectors.EVENT_READ, "stdout")
        selector.register(proc.stderr, selectors.EVENT_READ, "stderr")
        try:
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    output = kept["stdout"].decode(errors="replace")
                    raise ExecError(ErrorCode.TIMEOUT, f"the command did not end within {timeout_s:g}s on {device}; "
                                                       f"{what} was stopped (the command may still run there)", output)
                for key, _ in selector.select(left):
                    chunk = os.read(key.fileobj.fileno(), 65536)  # type: ignore[union-attr]
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    buffer = kept[key.data]
                    room = max_output - len(buffer)
                    buffer += chunk[:max(room, 0)]
                    if len(chunk) > room:
                        cut.add(key.data)
            status = proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            raise ExecError(ErrorCode.TIMEOUT, f"the command did not end within {timeout_s:g}s on {device}; {what} was "
                                               "stopped", kept["stdout"].decode(errors="replace")) from None
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
    stdout, stderr = kept["stdout"].decode(errors="replace"), kept["stderr"].decode(errors="replace")
    stderr += "".join(_cut_note(stream, max_output) for stream in sorted(cut))
    return stdout, stderr, status, bool(cut)


# ---- the console: a shell on a serial line ----------------------------------------------------

class _Line:
    """A console connection: a raw socket (past the gate, if any), or RFC 2217 through pyserial."""

    def __init__(self, endpoint: Mapping[str, Any], secret: str | None):
        self._sock: socket.socket | None = None
        self._forward = None
        self._port: Any = None
        host, port = str(endpoint.get("host")), int(endpoint.get("port", 0))
        if endpoint.get("protocol", "raw") == "raw":
            if secret:
                from .gate import connect_gated

                self._sock = connect_gated(host, port, secret, CONNECT_TIMEOUT_S)
            else:
                self._sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
            self._sock.setblocking(False)
            return
        from .uart_client import open_uart  # (pyserial's RFC 2217: only for a console that speaks nothing else)

        if secret:
            from .gate import LocalForward

            self._forward = LocalForward(endpoint, secret)
            endpoint = self._forward.endpoint
        self._port = open_uart(endpoint, timeout=0.02)

    def send(self, data: bytes) -> None:
        if self._sock is not None:
            self._sock.setblocking(True)
            try:
                self._sock.sendall(data)
            finally:
                self._sock.setblocking(False)
        else:
            self._port.write(data)

    def receive(self, wait_s: float) -> bytes | None:
        """What came within ``wait_s`` (b"" if nothing), None once the line is closed."""
        if self._sock is not None:
            ready = selectors.DefaultSelector()
            with ready:
                ready.register(self._sock, selectors.EVENT_READ)
                if not ready.select(max(wait_s, 0)):
                    return b""
            try:
                return self._sock.recv(65536) or None
            except BlockingIOError:
                return b""
        self._port.timeout = max(min(wait_s, 0.05), 0.001)
        return self._port.read(max(self._port.in_waiting, 1))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        if self._port is not None:
            self._port.close()
        if self._forward is not None:
            self._forward.close()


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _console(endpoint: Mapping[str, Any], secret: str | None, device: str, command: str, timeout_s: float,
             max_output: int) -> tuple[str, str, int, bool]:
    if "\n" in command or "\r" in command:
        raise ExecError(ErrorCode.BAD_COMMAND, "a console takes a command of one line: join its parts with ';'")
    if control := _LINE_CONTROL.search(command):  # ^C, ^U, ^D... act on the line even inside quotes
        raise ExecError(ErrorCode.BAD_COMMAND, f"a console command cannot hold the control character "
                                               f"{control.group()!r}: the serial line acts on it (it could end the "
                                               f"shell)")
    marker = "DLX" + os.urandom(8).hex()
    half = len(marker) // 2  # the typed line shows 'DLXab''cd..': only the shell's output joins them
    typed = lambda suffix: f"'{marker[:half]}'{marker[half:]}{suffix}"  # noqa: E731
    line = f"echo {typed('_S')}; sh -c {_shell_quote(command)}; echo {typed('_E')} $?"
    if len(line.encode()) > MAX_CONSOLE_LINE_BYTES:
        raise ExecError(ErrorCode.TOO_LARGE, f"the command is too long for a console line once wrapped "
                                             f"({len(line.encode())} of {MAX_CONSOLE_LINE_BYTES} bytes)")
    try:
        conn = _Line(endpoint, secret)
    except OSError as exc:
        raise ExecError(ErrorCode.UNREACHABLE, f"cannot reach {device}'s console: {exc}") from None
    try:
        _wait_prompt(conn, device, wake=True)
        conn.send(line.encode() + ENTER)
        return _read_marked(conn, marker, device, timeout_s, max_output)
    except OSError as exc:
        raise ExecError(ErrorCode.UNREACHABLE, f"lost {device}'s console: {exc}") from None
    finally:
        conn.close()


def _tail(data: bytes) -> str:
    """The last line a console printed, as a person sees it."""
    text = _ESCAPES.sub("", data.decode(errors="replace")).replace("\r\n", "\n")
    return text.rsplit("\n", 1)[-1].rsplit("\r", 1)[-1]


def _wait_prompt(conn: _Line, device: str, wake: bool) -> None:
    """Send Ctrl-C (and Enter, if ``wake``) and wait until the console shows a shell prompt
    and stays quiet; ``ExecError("no_prompt")`` if none shows within ``PROMPT_WAIT_S``."""
    wait_s = PROMPT_WAIT_S
    conn.send(INTERRUPT + (ENTER if wake else b""))
    seen = b""
    deadline = time.monotonic() + wait_s
    while True:
        left = deadline - time.monotonic()
        prompt = bool(seen) and _PROMPT_END.search(_tail(seen)) is not None
        if left <= 0 and not prompt:
            said = _tail(seen).strip() or _tail(seen.rstrip()).strip()
            raise ExecError(ErrorCode.NO_PROMPT, f"{device}'s console showed no shell prompt within {wait_s:g}s of "
                                                 f"Ctrl-C "
                                                 + (f"(it last said {said[-80:]!r})" if said else "(it said nothing)")
                                                 + ": is it booted, at a login, or held by another program? "
                                                 "look with: device-loop console")
        chunk = conn.receive(QUIET_S if prompt else min(left, 0.1))
        if chunk is None:
            raise ExecError(ErrorCode.UNREACHABLE, f"{device}'s console closed the connection")
        if not chunk and prompt:
            return  # a prompt, and quiet since
        seen = (seen + chunk)[-4096:]


def _read_marked(conn: _Line, marker: str, device: str, timeout_s: float,
                 max_output: int) -> tuple[str, str, int, bool]:
    """Read a wrapped command's output: from its start marker's line to its end marker and
    status. Past the deadline, Ctrl-C, the prompt waited for, and ``ExecError("timeout")``."""
    start = re.compile(re.escape(marker.encode()) + rb"_S\r*\n")
    end = re.compile(re.escape(marker.encode()) + rb"_E (\d{1,3})\r*\n")
    keep = len(marker) + 16  # what may be the start of the end marker, held back until more comes
    deadline = time.monotonic() + timeout_s
    before: bytes | None = b""  # until the start marker came
    kept, window, cut = bytearray(), b"", False

    def take(data: bytes) -> None:
        nonlocal cut
        room = max(max_output - len(kept), 0)
        kept.extend(data[:room])
        cut = cut or len(data) > room

    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            said = bytes(kept + window).replace(b"\r\n", b"\n").decode(errors="replace")
            try:
                _wait_prompt(conn, device, wake=False)
                after = "it was interrupted (Ctrl-C) and the console is back at its prompt"
            except ExecError as exc:
                after = f"Ctrl-C did not bring the prompt back ({exc.message})"
            raise ExecError(ErrorCode.TIMEOUT, f"the command did not end within {timeout_s:g}s on {device}; "
                                               f"{after}", said)
        chunk = conn.receive(min(left, 0.5))
        if chunk is None:
            raise ExecError(ErrorCode.UNREACHABLE, f"{device}'s console closed the connection while the command ran")
        if before is not None:
            before = (before + chunk)[-(64 * 1024):]  # the echo of the line, and what came before it
            found = start.search(before)
            if not found:
                continue
            chunk, before = before[found.end():], None
        window += chunk
        done = end.search(window)
        if done:
            take(window[:done.start()])
            status = int(done.group(1))
            break
        if len(window) > keep:
            take(window[:-keep])
            window = window[-keep:]
    stdout = bytes(kept).replace(b"\r\n", b"\n").decode(errors="replace")
    return stdout, _cut_note("output", max_output) if cut else "", status, cut
