"""What a container needs to use a resource (docs/architecture.md, "Containers and CDI"):
device nodes, mounts and environment variables, as a plugin's ``devloop_environment`` states
them. The exporter turns them into a CDI spec; nothing here writes a file or spawns."""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from typing import Mapping

from .holders import PTY_SLAVE_MAJORS

#: Bounds a plugin's answer is held to; an answer beyond them is refused whole.
MAX_NODES = 32
MAX_MOUNTS = 32
MAX_ENV = 64
MAX_PATH = 255
MAX_VALUE = 1024
MAX_OPTIONS = 16
#: The patterns, as text too: the exporter protocol's EnvironmentReport holds a report to them
ENV_NAME_PATTERN = r"[A-Z_][A-Z0-9_]{0,63}"
CGROUP_ACCESS_PATTERN = r"r?w?m?"
MOUNT_OPTION_PATTERN = r"[a-z0-9_=.-]{1,32}"
ENV_NAME = re.compile(ENV_NAME_PATTERN)
CGROUP_ACCESS = re.compile(CGROUP_ACCESS_PATTERN)
MOUNT_OPTION = re.compile(MOUNT_OPTION_PATTERN)


def _container_path(path: str) -> str:
    if not path.startswith("/") or len(path) > MAX_PATH or "\0" in path or ".." in path.split("/"):
        raise ValueError(f"a container path must be absolute, without '..', at most {MAX_PATH} characters: {path!r}")
    return path


@dataclass(frozen=True)
class DeviceNode:
    """A device node the container gets: ``path`` inside it, ``host_path`` on the host, its
    type (``c`` or ``b``), major and minor as the node itself has them, its file mode (never
    world-writable) and the cgroup access (``rw``, ``rwm``). Make one with :func:`device_node`."""

    path: str
    host_path: str
    type: str
    major: int
    minor: int
    file_mode: int
    permissions: str = "rw"

    def __post_init__(self) -> None:
        _container_path(self.path)
        _container_path(self.host_path)
        if self.type not in ("c", "b"):
            raise ValueError(f"a device node is 'c' or 'b', not {self.type!r}")
        if self.file_mode & stat.S_IWOTH or not 0 <= self.file_mode <= 0o7777:
            raise ValueError(f"a device node's mode is never world-writable: {oct(self.file_mode)}")
        if not self.permissions or not CGROUP_ACCESS.fullmatch(self.permissions):
            raise ValueError(f"cgroup access is some of 'rwm', in that order, not {self.permissions!r}")


@dataclass(frozen=True)
class Mount:
    """A host path bind-mounted into the container (a pty, driver libraries, firmware)."""

    host_path: str
    container_path: str
    options: tuple[str, ...] = ("ro", "nosuid", "nodev", "bind")

    def __post_init__(self) -> None:
        _container_path(self.host_path)
        _container_path(self.container_path)
        if len(self.options) > MAX_OPTIONS or any(not MOUNT_OPTION.fullmatch(o) for o in self.options):
            raise ValueError(f"mount options are short words: {self.options!r}")


@dataclass(frozen=True)
class ContainerEnvironment:
    """Everything a container needs of one resource: its ``nodes``, ``mounts`` and ``env``
    (name -> value). What ``devloop_environment`` returns."""

    nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.nodes) > MAX_NODES or len(self.mounts) > MAX_MOUNTS or len(self.env) > MAX_ENV:
            raise ValueError(f"at most {MAX_NODES} nodes, {MAX_MOUNTS} mounts and {MAX_ENV} variables")
        for name, value in self.env.items():
            if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
                raise ValueError(f"an environment variable's name is [A-Z_][A-Z0-9_]*: {name!r}")
            if not isinstance(value, str) or len(value) > MAX_VALUE or "\0" in value:
                raise ValueError(f"{name}'s value is a string of at most {MAX_VALUE} characters")


def device_node(host_path: str, path: str | None = None, permissions: str = "rw") -> DeviceNode:
    """The :class:`DeviceNode` of ``host_path`` as the node itself says it (type, major,
    minor, mode without world-write), seen in the container at ``path`` (default: the same
    path). Raises ``ValueError`` when it is not a character or block device. Opens nothing."""
    st = os.stat(host_path)
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        raise ValueError(f"{host_path} is not a device node")
    return DeviceNode(path=path or host_path, host_path=host_path, type="c" if stat.S_ISCHR(st.st_mode) else "b",
                      major=os.major(st.st_rdev), minor=os.minor(st.st_rdev),
                      file_mode=stat.S_IMODE(st.st_mode) & ~stat.S_IWOTH, permissions=permissions)


#: Where a tty (a board's console) appears in a container, and the variable that names it.
CONSOLE_PATH = "/dev/device-loop/console"
CONSOLE_ENV = "DEVICE_LOOP_CONSOLE"


def tty_environment(host_path: str, path: str = CONSOLE_PATH, env_name: str = CONSOLE_ENV) -> ContainerEnvironment:
    """What a container needs of the tty ``host_path`` (followed if a link), seen at ``path``
    and named by the variable ``env_name``: a real tty as a device node, a pty as a bind mount
    (a pty node opens only inside devpts: a node made elsewhere fails with EIO). A pty's
    mount names ``host_path`` itself, so a stable link that follows a new pty keeps working
    for the next container. Raises ``ValueError`` when it is not a character device."""
    real = os.path.realpath(host_path)
    st = os.stat(real)
    if not stat.S_ISCHR(st.st_mode):
        raise ValueError(f"{host_path} is not a character device")
    env = {env_name: path}
    if os.major(st.st_rdev) in PTY_SLAVE_MAJORS:
        return ContainerEnvironment(mounts=(Mount(host_path=host_path, container_path=path, options=("bind", "rw")),),
                                    env=env)
    return ContainerEnvironment(nodes=(device_node(real, path=path),), env=env)
