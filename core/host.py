"""What a plugin is told about the host it runs on."""
from __future__ import annotations

import dataclasses
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import ports
from .model import ConfiguredResource, Endpoint, LeaseRef, Resource, Service
from .process import ProcessRegistry
from .thread_server import ThreadServer


@dataclass
class HostContext:
    """The exporter's host, as plugins see it.

    ``bind_address`` is where services listen; ``advertise_address`` is what endpoints
    tell clients to dial (the host's tailnet name or address in a real lab). ``private_dir``
    is set for the start of a service behind a lease's gates (docs/architecture.md, "The
    lease gate"): it then listens on a unix socket there (``listen``, ``private_socket``), in
    a folder only the exporter's account enters, so that nothing but its gate reaches it.
    ``entries``
    are the config entries addressed to the plugin whose hook is called, each parsed by its
    model (``entry.config``): the exporter hands each plugin its own view (``for_plugin``).
    """

    name: str
    state_dir: Path
    sysfs_root: Path = Path("/sys")
    bind_address: str = "127.0.0.1"
    advertise_address: str = "127.0.0.1"
    entries: list[ConfiguredResource] = field(default_factory=list)
    processes: ProcessRegistry = None  # type: ignore[assignment]  # (None: __post_init__ makes one)
    private_dir: Path | None = None
    port_range: tuple[int, int] | None = None  # the TCP ports endpoints take (None: any the kernel gives)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        self.sysfs_root = Path(self.sysfs_root)
        if self.processes is None:
            self.processes = ProcessRegistry(self.state_dir)

    def for_plugin(self, plugin: str) -> HostContext:
        """This host as the hooks of ``plugin`` see it: the same host, with the entries
        that name ``plugin`` alone (so no plugin spells its own name to find them)."""
        return dataclasses.replace(self, entries=[e for e in self.entries if e.plugin == plugin])

    def listen(self) -> socket.socket:
        """A listening socket: on a free port of ``bind_address``, or, for a service behind a
        gate, a unix socket in ``private_dir``."""
        path = self.private_socket("listen")
        if path is not None:
            return ports.listen_unix(path)
        if self.port_range is not None:
            return ports.listen_in_range(self.bind_address, *self.port_range)
        return ports.listen_socket(self.bind_address)

    def free_port(self) -> int:
        """A port that was free a moment ago (in ``port_range``, if set), for a program that
        only takes a number."""
        if self.port_range is not None:
            with ports.listen_in_range(self.bind_address, *self.port_range) as sock:
                return sock.getsockname()[1]
        return ports.free_port(self.bind_address)

    def private_socket(self, name: str) -> str | None:
        """For a service behind a lease's gate that takes a path to listen on (ser2net, x11vnc,
        adb): a path for its unix socket in ``private_dir`` (new: named ``name`` and a random
        word), whose folder only the exporter's account enters. None when the service has no
        gate: it listens on a port then (``free_port``)."""
        if self.private_dir is None:
            return None
        return str(self.private_dir / f"{name[:24]}-{secrets.token_hex(4)}.sock")

    def endpoint(self, listener: socket.socket, resource: Resource, **fields: Any) -> Endpoint:
        """The endpoint of a service listening on ``listener`` (a port, or a private socket:
        then ``Endpoint.path``), with ``fields`` (protocol, params, command, role...)."""
        address = listener.getsockname()
        if isinstance(address, str):
            return Endpoint(kind=resource.kind, host=self.advertise_address, port=0, path=address, **fields)
        return Endpoint(kind=resource.kind, host=self.advertise_address, port=address[1], **fields)

    def serve_on_free_port(self, argv: list[str], resource: Resource, lease: LeaseRef, *,
                           name: str, protocol: str | None = "raw", params: dict | None = None,
                           env: dict | None = None, command: str | None = None, role: str | None = None) -> Service:
        """Start ``argv`` on a listening socket of a free port; ``{fd}`` in ``argv`` is its fd.

        The socket is bound before the process starts, so the endpoint accepts
        connections (queued by the kernel) the moment this returns, and no other process
        can take the port in between. ``{lifeline}`` in ``argv`` is the fd of the exporter's
        lifeline (``ProcessRegistry.lifeline``), for a process that must not outlive it.
        ``env`` is the process's environment; ``command`` and ``role`` are the endpoint's (see
        ``Endpoint``).
        """
        listener = self.listen()
        try:
            fds = {"{fd}": listener.fileno()}
            if any("{lifeline}" in a for a in argv):
                fds["{lifeline}"] = self.processes.lifeline().fd
            for placeholder, fd in fds.items():
                argv = [a.replace(placeholder, str(fd)) for a in argv]
            proc = self.processes.spawn(argv, name=f"{name}-{resource.device}-{lease.id}",
                                        lease=lease.id, pass_fds=tuple(fds.values()), env=env)
            endpoint = self.endpoint(listener, resource, protocol=protocol, params=params, command=command,
                                     role=role)
        finally:
            listener.close()  # the child holds it now; our copy would keep the port bound
        return Service(endpoints=[endpoint], processes=[proc])

    def serve_in_thread(self, serve: Callable[[socket.socket, int], None], resource: Resource, lease: LeaseRef, *,
                        name: str, protocol: str = "raw", params: dict | None = None, command: str | None = None,
                        role: str | None = None) -> Service:
        """Run ``serve(listener, stop_fd)`` in a thread of the exporter, on a listening socket
        of a free port; it must return once ``stop_fd`` is readable. For services that
        cost next to nothing (the simulated boards'); real devices get processes, which
        ``serve_on_free_port`` supervises."""
        listener = self.listen()
        server = ThreadServer(f"{name}-{resource.device}-{lease.id}", serve, listener)
        endpoint = self.endpoint(listener, resource, protocol=protocol, params=params, command=command, role=role)
        return Service(endpoints=[endpoint], processes=[server])

    def run_to_end(self, argv: list[str], *, name: str, timeout: float,
                   env: dict | None = None) -> tuple[int | None, str]:
        """Run a program to its end: ``(exit code, output)``, the code None when it overstayed
        ``timeout`` and was killed with everything it forked (its process group). Recorded
        like a service's processes, so a crash of the exporter leaves nothing running unseen.
        Raises ``OSError`` when it cannot start."""
        proc = self.processes.spawn(argv, name=name, env=env, job=True)
        if proc.wait(timeout):
            self.processes.forget(proc)
            assert proc.popen is not None  # (spawned here: a child of ours)
            return proc.popen.returncode, proc.output()
        proc.stop(grace=2.0)
        return None, proc.output()
