"""Podman from Debian for the tests, as a person runs it (docs/architecture.md, "Testing"):
rootful, runc, the ulimits, a local image imported from busybox-static once a session; its
storage, temporary files, network config and events in the session's folder, its run state
in a short folder of /tmp removed after (``CONTAINERS_CONF``, ``CONTAINERS_STORAGE_CONF``). ``podman import`` runs in a mount
namespace of its own with a throwaway /var/lib (podman 4.3 keeps a blob cache in
/var/lib/containers/cache whatever it is told), so nothing is written to /var/lib/containers.

Podman 4.3 reads CDI specs only from /var/run/cdi and /etc/cdi (containers.conf
``cdi_spec_dirs`` is not read by it; checked): a test's exporter writes into /var/run/cdi,
under an exporter name, a class and a device name unique to the test (``podman_names``),
which removes what it leaves there. The fixtures are conftest's (one image a session)."""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

CDI_DIR = Path("/var/run/cdi")  # the folder podman 4.3 reads (besides /etc/cdi)
UNRESOLVABLE = "unresolvable CDI devices"  # what podman says of a name no spec has
RUNROOT_MAX = 50  # the longest runroot podman 4.3's `container cleanup` accepts


@dataclass
class Podman:
    """podman with a folder of its own: ``run(*args)`` is ``podman ARGS``, finished."""
    folder: Path
    image: str

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.folder / "containers.conf"),
                "CONTAINERS_STORAGE_CONF": str(self.folder / "storage.conf")}

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(["podman", *args], env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

    def remove(self, *names: str) -> None:
        """Stop and remove containers (killing a ``podman run`` leaves its container running)."""
        self.run("rm", "--force", "--time", "0", "--ignore", *names)

    def container(self, device: str | None, script: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """``podman run --rm --network none [--device DEVICE] IMAGE sh -c SCRIPT``."""
        wanted = ["--device", device] if device else []
        return self.run("run", "--rm", "--network", "none", *wanted, self.image, "sh", "-c", script,
                        timeout=timeout)


def _configure(folder: Path, runroot: Path) -> None:
    (folder / "containers.conf").write_text(f"""\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
runtime = "runc"
tmp_dir = "{folder}/tmp"
image_copy_tmp_dir = "{folder}/tmp"
events_logger = "file"
events_logfile_path = "{folder}/events.log"

[network]
network_config_dir = "{folder}/networks"
""")
    (folder / "storage.conf").write_text(f"""\
[storage]
driver = "vfs"
graphroot = "{folder}/storage"
runroot = "{runroot}"
""")


def _busybox_rootfs(root: Path) -> None:
    """A root file system of busybox-static and its applets' links."""
    (root / "bin").mkdir(parents=True)
    for folder in ("dev", "proc", "sys", "tmp", "etc"):
        (root / folder).mkdir()
    shutil.copy2(shutil.which("busybox") or "/bin/busybox", root / "bin" / "busybox")
    applets = subprocess.run([root / "bin" / "busybox", "--list"], capture_output=True, text=True, check=True)
    for applet in applets.stdout.split():
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")


@pytest.fixture(scope="session")
def podman(tmp_path_factory) -> Iterator[Podman]:
    """Rootful podman in a folder of the session, with a busybox image imported once."""
    missing = [tool for tool in ("podman", "runc", "busybox", "unshare") if not shutil.which(tool)
               and not os.path.exists(f"/usr/sbin/{tool}")]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (./lab test installs podman, runc and busybox-static)")
    if os.geteuid() != 0:
        pytest.skip("rootful podman: run as root")
    folder = tmp_path_factory.mktemp("podman")
    # podman's `container cleanup` (conmon runs it as a container ends) refuses a runroot longer
    # than 50 characters, and `podman run --rm` then waits 20 s for conmon's timeout: an xdist
    # worker's folder (/tmp/pytest-of-root/pytest-N/popen-gwN/podman0/run) is longer than that
    runroot = Path(tempfile.mkdtemp(prefix="dl-podman-run-"))
    assert len(str(runroot)) <= RUNROOT_MAX, runroot
    _configure(folder, runroot)
    _busybox_rootfs(folder / "rootfs")
    tool = Podman(folder, f"localhost/device-loop-busybox-{secrets.token_hex(4)}")
    archive = subprocess.run(["tar", "-C", folder / "rootfs", "-c", "."], capture_output=True, check=True).stdout
    # a throwaway /var/lib for the import alone: podman 4.3 writes its blob cache there, told or not
    made = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           'mount -t tmpfs -o size=4m device-loop-test /var/lib && exec podman import '
                           '--change ENV=PATH=/bin - "$0"', tool.image],
                          input=archive, env=tool.env, capture_output=True, timeout=120)
    assert made.returncode == 0, made.stderr.decode(errors="replace")
    yield tool
    tool.run("rm", "--all", "--force", "--time", "0")  # (a container's /dev/shm is a mount in the folder)
    shutil.rmtree(runroot, ignore_errors=True)


@pytest.fixture
def podman_names():
    """An exporter name, a class and a device name no other test or lab on this machine uses
    (the CDI folder is the machine's); what the exporter leaves in it is removed after."""
    tag = secrets.token_hex(4)
    names = {"host": f"podtest-{tag}", "class": f"podtest-{tag}", "device": f"podtest-{tag}-0"}
    yield names
    for spec in CDI_DIR.glob(f"device-loop_{names['host']}_*.json"):
        spec.unlink()
