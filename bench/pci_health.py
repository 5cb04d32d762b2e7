"""The pci plugin's health checks of 64 PCI cards beside a bare read of the same sysfs files,
in one run (docs/architecture.md, "Health that heals").

A fake tree (the kernel's layout, as tests/fake_pci.py builds it) of 64 GPUs on their
bridges, each bound to a driver with its AER counters and link files. One period is the
plugin's ``devloop_health`` of all 64, as the exporter calls it; the floor is the files
that period read (recorded once, by an audit hook: every ``open``, and each card's
``driver`` link) read again by hand: ``os.open``, ``os.read``, ``os.close`` and a
``readlink``, nothing parsed. Periods of each are taken in turns, and the CPU time of the
process (``time.process_time``) per period compared. Target: <= 2x the bare read.

Usage: bench/pci_health.py [-n 300] [--cards 64]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from device_loop.core.host import HostContext  # noqa: E402
from device_loop.plugins.pci import PciPlugin  # noqa: E402
from fake_pci import pci_card  # noqa: E402

TARGET = 2.0
_recording: list[str] = []
_recorded: list[str] = []


def _audit(event, args):
    if _recording and event == "open" and isinstance(args[0], str):
        _recorded.append(args[0])


sys.addaudithook(_audit)


def one_period(plugin: PciPlugin, host: HostContext, resources) -> None:
    for resource in resources:
        plugin.devloop_health(host=host, resource=resource)


def bare_read(paths: list[str], links: list[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.read(fd, 4096)
        os.close(fd)
    for link in links:
        os.readlink(link)


def cpu_of(work, rounds: int) -> float:
    started = time.process_time()
    for _ in range(rounds):
        work()
    return (time.process_time() - started) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=300, help="periods of each to time (default 300)")
    parser.add_argument("--cards", type=int, default=64, help="PCI cards in the tree (default 64)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "sys"
        for n in range(args.cards):
            pci_card(root, f"0000:{n + 1:02x}:00.0", driver="amdgpu", vendor="1002", device="744c",
                     subsystem=("1002", "0e3b"), drm=(f"card{n}", f"renderD{128 + n}"))
        plugin = PciPlugin()
        host = HostContext(name="bench", state_dir=Path(folder) / "state", sysfs_root=root)
        resources = list(plugin.devloop_discover(host=host))
        assert len(resources) == args.cards
        _recording.append("")
        one_period(plugin, host, resources)
        _recording.pop()
        paths, folder_of = [], ""
        for path in _recorded:  # (a card's folder is opened once, its files relative to it)
            if os.path.isdir(path):
                folder_of = path
            else:
                paths.append(os.path.join(folder_of, path))
        links = [str(root / "bus" / "pci" / "devices" / plugin.cards[r.identifier].address / "driver")
                 for r in resources]
        healths = {plugin.devloop_health(host=host, resource=r).status for r in resources}
        assert healths == {"ok"}, healths
        plugin_times, bare_times = [], []
        for _ in range(args.n):  # in turns, so that both see the same machine
            plugin_times.append(cpu_of(lambda: one_period(plugin, host, resources), 1))
            bare_times.append(cpu_of(lambda: bare_read(paths, links), 1))
    plugin_cpu, bare_cpu = statistics.mean(plugin_times), statistics.mean(bare_times)
    ratio = plugin_cpu / bare_cpu
    print(f"health of {args.cards} fake PCI cards, {args.n} periods each (CPU time a period, mean):")
    print(f"  pci plugin's devloop_health, all cards   {plugin_cpu * 1000:8.3f} ms")
    print(f"  bare read of the same {len(paths)} files + {len(links)} links {bare_cpu * 1000:8.3f} ms")
    print(f"  ratio {ratio:.2f}x (target <= {TARGET:g}x): {'ok' if ratio <= TARGET else 'OVER'}")


if __name__ == "__main__":
    main()
