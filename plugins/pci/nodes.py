"""What a container needs to use a card: the device nodes of its bound driver, found from
sysfs (``drm/renderD128`` is ``/dev/dri/renderD128``; the nvidia driver's GPU is
``/dev/nvidiaN``, N its device minor), and variables naming the card by its address and,
for an NVIDIA GPU, its UUID: never an index.

Nodes are looked for under the ``dev`` folder beside the sysfs root (``/dev`` beside
``/sys``; a test's fake tree has its own), and only those present are given, each read
from the node itself (``device_node``). Nothing is opened; nothing is spawned.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from device_loop.plugin import ContainerEnvironment, DeviceNode, device_node

from . import nvidia
from .cards import PciCard, devices_folder
from .sysfs import link_name, names_in

ADDRESS_VARIABLE = "DEVICE_LOOP_PCI_ADDRESS"
_DRM = re.compile(r"(?:renderD|card)\d{1,3}")
_ACCEL = re.compile(r"accel\d{1,3}")
#: Nodes a driver's cards share (present or not on a host), beside each card's own.
SHARED = {nvidia.DRIVER: ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"),
          "amdgpu": ("/dev/kfd",), "vfio-pci": ("/dev/vfio/vfio",)}


def dev_root(sysfs_root: Path) -> Path:
    """Where the host's device nodes are: the ``dev`` folder beside the sysfs root."""
    return Path(sysfs_root).parent / "dev"


def own_nodes(sysfs_root: Path, card: PciCard) -> list[str]:
    """The container paths of the nodes that are ``card``'s alone, as sysfs names them:
    render nodes first (what compute opens), then the rest."""
    path = devices_folder(sysfs_root) / card.address
    drm = sorted(names_in(path / "drm", _DRM, limit=8), key=lambda name: (not name.startswith("renderD"), name))
    nodes = [f"/dev/dri/{name}" for name in drm] + [f"/dev/accel/{name}" for name in names_in(path / "accel", _ACCEL,
                                                                                             limit=8)]
    if card.driver == nvidia.DRIVER:
        minor = nvidia.gpu_information(Path(sysfs_root).parent / "proc", card.address).minor
        if minor is not None:
            nodes.insert(0, f"/dev/nvidia{minor}")
    elif card.driver == "vfio-pci":
        group = link_name(path / "iommu_group")
        if group is not None and group.isdigit():
            nodes.append(f"/dev/vfio/{group}")
    return nodes


def host_path(sysfs_root: Path, container_path: str) -> Path:
    """Where the node a container sees at ``container_path`` (``/dev/...``) is on the host."""
    return dev_root(sysfs_root) / container_path.removeprefix("/dev/")


def primary_node(sysfs_root: Path, card: PciCard) -> str | None:
    """The host path of the node a user of ``card`` opens first (its render node, its
    ``/dev/nvidiaN``): who holds it is watched for orphans. From sysfs alone."""
    nodes = own_nodes(sysfs_root, card)
    return str(host_path(sysfs_root, nodes[0])) if nodes else None


def _present(sysfs_root: Path, container_paths: list[str]) -> list[DeviceNode]:
    found = []
    for path in container_paths:
        where = host_path(sysfs_root, path)
        if not os.path.lexists(where):
            continue
        try:
            found.append(device_node(str(where), path))
        except (OSError, ValueError):  # not a node (a hostile tree), or gone meanwhile
            continue
    return found


def environment(sysfs_root: Path, card: PciCard) -> ContainerEnvironment:
    """The nodes, and variables, a container needs to use ``card``."""
    nodes = _present(sysfs_root, own_nodes(sysfs_root, card) + list(SHARED.get(card.driver or "", ())))
    env = {ADDRESS_VARIABLE: card.address}
    if card.driver == nvidia.DRIVER:
        uuid = nvidia.gpu_information(Path(sysfs_root).parent / "proc", card.address).uuid
        if uuid:  # (both take a GPU's UUID; an index would name whatever card the container's driver lists first)
            env["NVIDIA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"] = uuid
    return ContainerEnvironment(nodes=tuple(nodes), env=env)
