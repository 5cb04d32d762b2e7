"""The Python client library.

    with Lab(url).reserve("sim-board-0", ttl="10m") as lease:
        with lease.connect("console") as console:   # a socket, past the lease gate if the lab has one
            console.sendall(b"uname\r")

``reserve`` answers at once with a pending lease; entering the ``with`` block waits
until its endpoints are up, and leaving it releases the lease, also on exceptions. A lease
that must not outlive this process (a CI job's) is a keepalive lease: the ``with`` block
keeps it alive from a thread (``client/keepalive.py``), and if the process dies the device is
free within the keepalive:

    with lab.reserve(class_="riscv-sbc", keepalive="30s", image="rootfs-v2") as lease:
        ...                                      # lease.lost: why, if the lab ended it meanwhile

By class and tags, and queueing when nothing that matches is free:

    ticket = lab.reserve(class_="riscv-sbc", tags=["rvv"], queue=True)   # a Lease, or a Ticket
    with ticket.wait() as lease:                 # a Ticket waits for its grant (a Lease waits for nothing)
        ...

What the lab answers is typed as the coordinator answers it (``core/answers.py``: a
``Lease``'s ``data`` is a ``LeaseAnswer``, ``Lab.devices()`` a list of ``DeviceAnswer``);
an operation (``flash``, ``recover``, ``power``, ``settle``, ``operate``) is an
``Operation``, as ``exec`` is an ``ExecResult``.
"""
from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

from device_loop.core import LIVE_LEASE_STATES, LIVE_OP_STATES
from device_loop.core.durations import parse_duration, when_granted
from device_loop.core.errors import ErrorCode

from .http import Coordinator, CoordinatorError
from .keepalive import RETRY_S, KeepAlive, keepalive_period

if TYPE_CHECKING:  # (exec, fingerprints, the answers' types: loaded when used, pydantic is heavy for a short command)
    from device_loop.core.answers import (CdiAnswer, DeviceAnswer, EndpointAnswer, HostAnswer, LeaseAnswer, LogEntry,
                                          OperationAnswer, TicketAnswer)
    from device_loop.core.device_exec import ExecResult
    from device_loop.core.ab.jobs import Fingerprint

    from .jobs_api import Jobs

class LeaseFailed(CoordinatorError):
    """The lease ended, or did not get ready in time."""


def require_ready(lease: Mapping[str, Any]) -> None:
    """Refuse (``CoordinatorError``) a lease, as JSON, whose endpoints cannot be used now."""
    if lease["state"] not in LIVE_LEASE_STATES:
        raise CoordinatorError(ErrorCode.LEASE_ENDED, f"{lease['id']} has ended ({lease['reason']})")
    if not lease["ready"]:
        raise CoordinatorError(ErrorCode.NOT_READY, f"{lease['id']} is not ready yet: {lease['reason']}")


def follow_op(api: Coordinator, op: OperationAnswer, on_progress: Callable[[OperationAnswer], object] | None = None,
              timeout: float | None = None) -> OperationAnswer:
    """Wait until an operation (of any kind) ends (``on_progress(op)`` at each news, at least
    once a second while it runs); the op as it ended.

    Raises ``CoordinatorError("timeout")`` after ``timeout`` seconds (the operation goes on).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while op["state"] in LIVE_OP_STATES:
        if on_progress:
            on_progress(op)
        if deadline is not None and time.monotonic() > deadline:
            raise CoordinatorError(ErrorCode.TIMEOUT, f"{op['id']} is still {op['state']} after {timeout:g}s; "
                                                      f"follow it with: device-loop op {op['id']}")
        op = api.get(f"/ops/{op['id']}", wait=1, unless=op["state"])
    return op


class Operation:
    """An operation on a leased device (a flash, a power switch, a settle, a plugin's kind),
    as it stood when last fetched: ``data`` is the coordinator's ``OperationAnswer``."""

    def __init__(self, api: Coordinator, data: OperationAnswer):
        self.api = api
        self.data = data

    @property
    def id(self) -> str:
        return self.data["id"]

    @property
    def kind(self) -> str:
        return self.data["kind"]

    @property
    def state(self) -> str:
        """``queued``, ``running``, then ``done`` or ``failed``."""
        return self.data["state"]

    @property
    def message(self) -> str:
        """What happened, in words."""
        return self.data.get("message", "")

    @property
    def result(self) -> dict[str, Any] | None:
        """What it found (a power operation's ``verdict``, a plugin's dict), once it ended."""
        return self.data.get("result")

    def wait(self, timeout: float | None = None) -> "Operation":
        """Follow it until it ends (``CoordinatorError("timeout")`` after ``timeout`` seconds; it goes on)."""
        self.data = follow_op(self.api, self.data, timeout=timeout)
        return self

    def __repr__(self) -> str:
        said = f": {self.message}" if self.message else ""
        return f"<Operation {self.id} {self.kind} on {self.data.get('device', '?')}, {self.state}{said}>"


class Lab:
    def __init__(self, url: str | None = None, user: str | None = None, token: str | None = None):
        """``url`` (else ``$DEVICE_LOOP_COORDINATOR``), ``token`` (else ``$DEVICE_LOOP_TOKEN`` or
        ``~/.config/device-loop/token``); ``user`` counts only in a lab without tokens."""
        self.api = Coordinator(url, user, token=token)

    def __repr__(self) -> str:
        return f"<Lab {self.api.url} as {self.api.user}>"

    def devices(self, device_class: str | None = None, tags: list[str] | tuple[str, ...] = ()) -> list[DeviceAnswer]:
        """The lab's devices (of ``device_class``, with all of ``tags``)."""
        params: dict[str, str] = {"class": device_class} if device_class else {}
        if tags:
            params["tags"] = ",".join(tags)
        return self.api.get("/devices", **params)

    def hosts(self) -> list[HostAnswer]:
        """The lab's hosts: their exporters, plugins and devices."""
        return self.api.get("/hosts")

    @property
    def jobs(self) -> "Jobs":
        """The lab's jobs (``client/jobs_api.py``): ``submit``, ``get``, ``wait``, ``evidence``."""
        from .jobs_api import Jobs  # (it imports this module)

        return Jobs(self.api)

    def reserve(self, device: str | None = None, ttl: str | float | None = None, *, class_: str | None = None,
                tags: list[str] | tuple[str, ...] = (), queue: bool = False, needs: str | None = None,
                fallback: str | None = None, fallback_after: str | float | None = None,
                keepalive: str | float | None = None, image: str | None = None,
                idempotency_key: str | None = None) -> "Lease | Ticket":
        """Reserve ``device``, or any free device of ``class_`` with all of ``tags`` (the one
        idle the longest), now: never blocks; the lease may still be pending. With ``queue``,
        when nothing that matches is free, a ``Ticket`` (``ticket.wait()`` is the lease once
        granted) instead of a refusal. ``ttl`` (``"2h"``, or seconds) counts from the grant;
        without it the lab's default (its coordinator's ``--default-ttl``). ``needs``:
        ``"real-hw"`` (a board, or a simulated one) or ``"any"`` (a virtual machine or an
        emulator first; neither class nor tags needed), and with ``"any"``, ``fallback="real-hw"``:
        a queued ticket takes a real device too once it waited ``fallback_after`` (``"2m"``, or
        seconds; default 60 s). ``keepalive`` (``"30s"``, or seconds; 5 s to 1 h): a lease that
        lapses unless kept alive that often (its ``with`` block does, ``KeepAlive`` does, or
        ``lease.keep_alive()``), and a ticket that lapses unless followed (``ticket.wait()``);
        without a ``ttl`` it lasts up to the lab's maximum. ``image`` (a registry image's ref or
        name): by class, tags or needs, a free device already running it (its last flash wrote
        it and read it back) is taken first. The same ``idempotency_key`` again answers what
        the first call made, and makes nothing more."""
        body: dict = {"tags": list(tags), "queue": queue}
        if ttl is not None:  # (else the lab's own default applies: docs/architecture.md, "Leases")
            body["ttl_s"] = parse_duration(ttl)
        for key, value in (("needs", needs), ("fallback", fallback)):
            if value is not None:
                body[key] = str(value)
        if fallback_after is not None:
            body["fallback_after_s"] = parse_duration(fallback_after)
        if keepalive is not None:  # (a number as it is: the lab says the range of one out of it)
            body["keepalive_s"] = keepalive if isinstance(keepalive, (int, float)) else parse_duration(keepalive)
        if image is not None:
            body["image"] = image
        if device is not None:
            body["device"] = device
        if class_ is not None:
            body["class"] = class_
        answer = self.api.post("/leases", body, key=idempotency_key)
        return Ticket(self.api, answer) if "ticket" in answer else Lease(self.api, answer)

    def whoami(self) -> dict:
        """Who the lab takes you for: name, kind, band, scope, and a scoped token's budget left
        (a ``WhoamiAnswer``)."""
        return self.api.get("/whoami")

    def tickets(self, everyone: bool = False) -> list["Ticket"]:
        """Your queue tickets, open ones first (an admin's ``everyone``: all)."""
        return [Ticket(self.api, data) for data in self.api.get("/tickets", **({"all": "true"} if everyone else {}))]

    def ticket(self, ticket_id: str) -> "Ticket":
        """One of your tickets, as it stands (reading it claims nothing: ``Ticket.claim``)."""
        return Ticket(self.api, self.api.get(f"/tickets/{ticket_id}"))

    def lease(self, lease_id: str) -> "Lease":
        """One of your leases."""
        return Lease(self.api, self.api.get(f"/leases/{lease_id}"))

    def my_leases(self, device: str | None = None) -> list["Lease"]:
        """Your live leases; with ``device``, your lease on it (or, if it ended, your last)."""
        params = {"device": device} if device else {}
        return [Lease(self.api, data) for data in self.api.get("/leases", **params)]

    def log(self, device: str) -> list[LogEntry]:
        """A device's ring log: its last changes of state, with their causes and actors."""
        return self.api.get(f"/devices/{device}/log")

    def op(self, op_id: str) -> Operation:
        """An operation: kind, state, phase, progress, its message and result."""
        return Operation(self.api, self.api.get(f"/ops/{op_id}"))

    def operations(self, device: str, kind: str | None = None) -> list[Operation]:
        """A device's last 20 operations (only those of ``kind``), newest first."""
        return [Operation(self.api, data)
                for data in self.api.get(f"/devices/{device}/operations", **({"kind": kind} if kind else {}))]


class Lease:
    """A lease on a device, as it stood when last fetched: ``data`` is the coordinator's
    ``LeaseAnswer`` (endpoints, state, expiry...)."""

    def __init__(self, api: Coordinator, data: LeaseAnswer):
        self.api = api
        self.data = data
        self.keeper: KeepAlive | None = None  # a keepalive lease's, while its ``with`` block runs

    def __repr__(self) -> str:
        ready = ", ready" if self.data.get("ready") else ""
        return f"<Lease {self.id} on {self.device}, {self.state}{ready}, expires {self.data.get('expires_at')}>"

    @property
    def device(self) -> str:
        return self.data["device"]

    @property
    def id(self) -> str:
        return self.data["id"]

    @property
    def state(self) -> str:
        return self.data["state"]

    @property
    def endpoints(self) -> list[EndpointAnswer]:
        return self.data["endpoints"]

    def _endpoint(self, what: str, protocol: str | None = None) -> EndpointAnswer:
        """The first endpoint whose role is ``what`` (and that speaks ``protocol``), else the
        first of resource kind ``what``: ``console`` finds any serial console, ``uart`` the
        endpoints of ``uart`` resources."""
        speaks = [e for e in self.endpoints if protocol in (None, e.get("protocol"))]
        for field in ("role", "kind"):
            for endpoint in speaks:
                if endpoint.get(field) == what:
                    return endpoint
        raise KeyError(f"lease {self.id} has no {what} endpoint{f' speaking {protocol}' if protocol else ''} (it "
                       f"has: {', '.join(e.get('role') or e['kind'] for e in self.endpoints) or 'none yet'})")

    def endpoint(self, what: str) -> tuple[str, int]:
        """``(host, port)`` of the first endpoint of role ``what`` (``console``, ``adb``,
        ``rfb``...; an ``EndpointRole``), else of resource kind ``what`` (``uart``). In a lab
        with tokens it asks for the lease's secret first: use ``connect``."""
        endpoint = self._endpoint(what)
        return endpoint["host"], endpoint["port"]

    def connect(self, what: str, protocol: str | None = None, timeout: float = 10.0) -> socket.socket:
        """A TCP connection to the first endpoint of role ``what`` (else of resource kind
        ``what``; and of ``protocol``), past the lease gate where there is one: in a lab with
        tokens the connection first sends ``DEVLOOP <secret>\n`` (the endpoint's own) and reads
        ``OK\n``, and then it is the service's."""
        endpoint = self._endpoint(what, protocol)
        if secret := endpoint.get("secret"):
            from device_loop.core.gate import connect_gated  # (asyncio and friends: only when needed)

            return connect_gated(endpoint["host"], endpoint["port"], secret, timeout)
        return socket.create_connection((endpoint["host"], endpoint["port"]), timeout=timeout)

    def refresh(self, wait_s: float = 0) -> "Lease":
        """Fetch the lease again; with ``wait_s``, wait that long for it to leave ``pending``."""
        params = {"wait": wait_s, "unless": "pending"} if wait_s else {}
        self.data = self.api.get(f"/leases/{self.id}", **params)
        return self

    def wait_ready(self, timeout: float = 60.0) -> "Lease":
        """Block until the endpoints are up; raise ``LeaseFailed`` if it ends or times out."""
        deadline = time.monotonic() + timeout
        while not self.data["ready"]:
            if self.state not in LIVE_LEASE_STATES:
                raise LeaseFailed(self.state, f"lease {self.id} is {self.state}: {self.data['reason']}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LeaseFailed(ErrorCode.TIMEOUT, f"lease {self.id} not ready after {timeout:g}s "
                                                     f"({self.data['reason']})")
            # Long-poll while pending; poll gently while active but not ready (device offline).
            if self.state == "pending":
                self.refresh(wait_s=min(remaining, 30.0))
            else:
                time.sleep(min(remaining, 0.5))
                self.refresh()
        return self

    def cdi(self) -> "CdiAnswer":
        """Its CDI spec, as its exporter wrote it, and ``device_name``, what ``podman run
        --device`` takes on the exporter's host (docs/architecture.md, "Containers and CDI")."""
        return self.api.get(f"/leases/{self.id}/cdi")

    def renew(self, ttl: str | float) -> "Lease":
        """Extend it: it then ends ``ttl`` (``"2h"``, or seconds) from now."""
        self.data = self.api.post(f"/leases/{self.id}/renew", {"ttl_s": parse_duration(ttl)})
        return self

    def keep_alive(self, timeout: float | None = None) -> "Lease":
        """Keep a keepalive lease alive: it then expires its keepalive from now, never past its
        end (``ends_at``). ``CoordinatorError`` (``lease_ended``) once it has ended. A keep-alive
        is harmless to repeat: it is sent without an Idempotency-Key. ``timeout``: each try's."""
        self.data = self.api.post(f"/leases/{self.id}/renew", {}, keyed=False, timeout=timeout)
        return self

    def kept_alive(self, on_lost: Callable[[str], object] | None = None) -> KeepAlive:
        """Keep it alive from a thread (``client/keepalive.py``) until ``stop()`` or its release;
        ``on_lost(reason)`` once if the lab ends it meanwhile. Started once: later calls answer
        the same ``KeepAlive``."""
        if self.keeper is None:
            self.keeper = KeepAlive(self, on_lost).start()
        return self.keeper

    @property
    def lost(self) -> str | None:
        """Why the lab ended it while it was kept alive (revoked, expired, ...), or None."""
        return self.keeper.lost if self.keeper is not None else None

    def start_operation(self, kind: str, args: dict[str, Any] | None = None) -> Operation:
        """Start an operation of ``kind`` (one the device's resources run: ``Lab.devices()``,
        ``resources[].operations``) with ``args``; the operation at once, ``queued``."""
        return Operation(self.api, self.api.post(f"/leases/{self.id}/operations", {"kind": kind, "args": args or {}}))

    def operate(self, kind: str, /, wait: bool = True, timeout: float | None = None, **args: Any) -> Operation:
        """Run an operation of ``kind`` on the leased device with ``args``
        (``lease.operate("capture-boot-log", seconds=5)``); with ``wait``, the operation once
        it ended (check its ``state``: ``done`` or ``failed``; ``result`` holds what it found,
        ``message`` what happened), else at once. ``timeout``: ``CoordinatorError("timeout")``
        after that many seconds (it goes on). An argument named ``wait`` or ``timeout``:
        ``lease.start_operation(kind, {...}).wait()``."""
        op = self.start_operation(kind, args)
        return op.wait(timeout) if wait else op

    def flash(self, image: str, wait: bool = True, timeout: float | None = None) -> Operation:
        """Flash ``image`` (its ref, ``sha256:...``, or its name) onto the leased device; with ``wait``, the
        operation once it ended (check its ``state``: ``done`` or ``failed``)."""
        return self.operate("flash", wait=wait, timeout=timeout, image=image)

    def recover(self, wait: bool = True, timeout: float | None = None) -> Operation:
        """Flash the device's latest known-good image (this clears ``needs_recovery``)."""
        op = Operation(self.api, self.api.post(f"/leases/{self.id}/recover"))
        return op.wait(timeout) if wait else op

    def power(self, action: str, off_time: float | None = None, wait: bool = True,
              timeout: float | None = None) -> Operation:
        """Switch the leased device's power: ``"on"``, ``"off"``, ``"cycle"`` (off for ``off_time``
        seconds, default the switch's, then on) or ``"status"``; with ``wait``, the operation once
        it ended. Its ``result["verdict"]`` is ``"verified"`` only when the switch read the change
        back or the console showed it (silent while off, printing again after on:
        ``result["first_byte_s"]``); ``"unverified"`` means nothing showed it happened."""
        body: dict[str, Any] = {"action": action}
        if off_time is not None:
            body["off_time_s"] = off_time
        op = Operation(self.api, self.api.post(f"/leases/{self.id}/power", body))
        return op.wait(timeout) if wait else op

    def settle(self, timeout: float | None = None) -> Operation:
        """Run the device's cool-down steps now and wait until they are done (between two
        benchmark runs); the operation as it ended (``done`` at once for a device with none)."""
        return Operation(self.api, self.api.post(f"/leases/{self.id}/settle")).wait(timeout)

    def exec(self, command: str, timeout_s: float = 60.0, *, identity_file: str | None = None,
             max_output: int = 1 << 20) -> "ExecResult":
        """Run ``command`` (a shell command line) on the leased device, through its adb, else
        ssh, else console endpoint, from this machine; an ``ExecResult`` (``stdout``, ``stderr``,
        ``status``, ``channel``, ``elapsed_s``; on a console stderr is merged into stdout), or
        ``ExecError`` (``code``: no_channel, no_prompt, timeout, unreachable, too_large,
        bad_command, switched_off). ``identity_file``: the ssh key (else ``$DEVICE_LOOP_SSH_IDENTITY``, else
        ssh's own). ``timeout_s`` bounds the command; ``max_output`` what is kept of each stream."""
        from device_loop.core.device_exec import exec_on_lease

        if not self.data["ready"]:
            self.refresh()
        return exec_on_lease(self.data, command, timeout_s, identity_file=identity_file, max_output=max_output)

    def fingerprint(self, *, identity_file: str | None = None) -> "Fingerprint":
        """What a reviewer needs to judge a number measured on the leased device
        (``core/ab/fingerprint.py``): read through ``exec`` from this machine, with what the lab
        says of the device (its class, host, the image last flashed, its plugins' facts)."""
        from device_loop.core.ab.fingerprint import gather

        device = self.api.get(f"/devices/{self.data['device']}")  # with the image its last flash wrote
        coordinator_version = str(self.api.get("/health").get("version", ""))
        return gather(lambda command, timeout_s: self.exec(command, timeout_s, identity_file=identity_file),
                      self.data, device, coordinator_version)

    def release(self) -> "Lease":
        """Give it back (its services stop; the device goes on to its steps between leases);
        keeping it alive stops first."""
        if self.keeper is not None:
            self.keeper.stop()
        self.data = self.api.post(f"/leases/{self.id}/release")
        return self

    def __enter__(self) -> "Lease":
        """Wait until it is ready (a keepalive lease kept alive meanwhile, and until it is released)."""
        try:
            if self.data.get("keepalive_s"):
                self.kept_alive()
            return self.wait_ready()
        except BaseException:
            self.release()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class TicketEnded(CoordinatorError):
    """A ticket was cancelled, or its grant expired unclaimed: it will never be a lease."""


class Ticket:
    """A place in the lab's queue (``Lab.reserve(..., queue=True)``): granted the first free
    device that matches, people before agents; ``wait()`` follows it to its lease."""

    def __init__(self, api: Coordinator, data: TicketAnswer):
        self.api = api
        self.data = data

    def __repr__(self) -> str:
        where = f", position {self.position}" if self.position is not None else ""
        return f"<Ticket {self.id} for {self.data.get('wants', '?')}, {self.state}{where}>"

    @property
    def id(self) -> str:
        return self.data["ticket"]

    @property
    def state(self) -> str:
        return self.data["state"]

    @property
    def position(self) -> int | None:
        return self.data["position"]

    def refresh(self, wait_s: float = 0) -> "Ticket":
        """Read it again (this changes nothing); ``wait_s``: at its first change, or then."""
        self.data = self.api.get(f"/tickets/{self.id}", **({"wait": wait_s} if wait_s else {}))
        return self

    def claim(self, wait_s: float = 0) -> "Ticket":
        """Follow it as its requester: a granted ticket is claimed (its lease is yours), a
        waiting keepalive one is kept; ``wait_s``: at its first change, or then."""
        # (unkeyed, as a keep-alive is: harmless to repeat, and made every few seconds while it waits)
        self.data = self.api.post(f"/tickets/{self.id}/claim", {"wait_s": wait_s} if wait_s else {}, keyed=False,
                                  timeout=self.api.timeout + wait_s)
        return self

    def wait(self, timeout: float | None = None, on_change: Callable[["Ticket"], object] | None = None) -> Lease:
        """Block until the ticket is granted (``on_change(ticket)`` at each news, the position
        while it waits); the lease, claimed. Raises ``TicketEnded`` if it is cancelled or its
        grant expired, ``CoordinatorError("timeout")`` after ``timeout`` seconds (it waits on).
        A keepalive ticket is followed at least every third of its keepalive meanwhile (each
        ``claim`` keeps it), and its lease must be kept alive from then on: ``with ticket.wait() as lease``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        keepalive = self.data.get("keepalive_s")
        most = 5.0 if not keepalive else min(5.0, keepalive_period(keepalive))
        while self.state in ("waiting", "granted"):
            if on_change and self.state == "waiting":
                on_change(self)
            remaining = 25.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise CoordinatorError(ErrorCode.TIMEOUT, f"{self.id} is still waiting after {timeout:g}s (position "
                                                          f"{self.position}); follow it with: device-loop ticket "
                                                          f"{self.id} --wait, or cancel it: device-loop cancel "
                                                          f"{self.id}")
            try:  # (the position may change meanwhile: said at the next turn; a grant is claimed)
                self.claim(wait_s=min(remaining, most) if self.state == "waiting" else 0)
            except CoordinatorError as exc:
                if 0 < exc.status < 500:
                    raise
                # the coordinator away (restarting, its database gone a moment): asked again soon;
                # it counts the ticket's keepalive from when it is back (docs/architecture.md, "A lab
                # that was away")
                time.sleep(min(RETRY_S, max(0.0, remaining)))
        if self.data["lease"] is None or self.state not in ("granted", "claimed"):
            raise TicketEnded(self.state, f"{self.id} is {self.state}: {self.data['reason'] or 'no lease'}")
        if on_change:
            on_change(self)
        return Lease(self.api, self.data["lease"])

    def cancel(self) -> "Ticket":
        """Leave the queue (a granted ticket gives its lease back)."""
        self.data = self.api.post(f"/tickets/{self.id}/cancel")
        return self


def telling_place(say: Callable[[str], object]) -> Callable[[Ticket], None]:
    """An ``on_change`` for ``Ticket.wait`` that says (``say(text)``) the ticket's place each
    time it changes: what ``reserve --queue --wait`` and ``with --queue`` both print."""
    last: list[tuple[str, int | None]] = []

    def tell(ticket: Ticket) -> None:
        said = (ticket.state, ticket.position)
        if last == [said]:
            return
        last[:] = [said]
        where = f"position {ticket.position}" if ticket.state == "waiting" else ticket.state
        estimate = ticket.data.get("estimate") if ticket.state == "waiting" else None
        likely = f"; likely granted {when_granted(estimate)}" if estimate else ""
        say(f"{ticket.id}: {where} ({ticket.data['kind']}, for a device {ticket.data['wants']}){likely}")
    return tell
