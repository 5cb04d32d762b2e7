"""``device-loop qemu-guest --arch ARCH --out DIR``: build a VM slot's guest (a Debian kernel
unpacked, never installed, and a busybox initramfs) into a folder, for a lab admin to point
a slot at."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from device_loop.plugins.qemu.guest import ARCHES, GuestError, build_disk, build_guest


@click.command("qemu-guest", short_help="build a VM guest (kernel + initramfs) into a folder")
@click.option("--arch", type=click.Choice(list(ARCHES)), required=True, help="the guest's architecture")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="the folder to build in (packages are fetched once and kept there)")
@click.option("--authorized-key", "key_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="an OpenSSH public key file: the guest runs dropbear and lets this key in as root")
@click.option("--disk-from", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="also make OUT/ARCH/data.qcow2, an ext4 disk holding this folder's files (mounted on /data)")
@click.option("--json", "as_json", is_flag=True, help="print the paths as JSON")
def qemu_guest_command(arch: str, out: Path, key_file: Path | None, disk_from: Path | None, as_json: bool) -> None:
    """Build a guest for a VM slot: a Debian kernel fetched with apt-get download and
    unpacked into OUT (nothing is installed), and an initramfs around busybox-static that
    gives a root shell on the serial console. Prints the kernel, initramfs and kernel command
    line to give the slot."""
    try:
        key = key_file.read_text(errors="replace").strip() if key_file else None
        guest = build_guest(arch, out, authorized_key=key)
        disk = build_disk(disk_from, out / arch / "data.qcow2") if disk_from else None
    except (GuestError, OSError) as exc:
        click.echo(f"device-loop: {exc}", err=True)
        sys.exit(1)
    built = {"arch": guest.arch, "kernel": str(guest.kernel), "initrd": str(guest.initrd), "append": guest.append,
             "kernel_version": guest.kernel_version, **({"disk": str(disk)} if disk else {}),
             **({"host_key": guest.host_key} if guest.host_key else {})}
    if as_json:
        click.echo(json.dumps(built, indent=2))
    else:
        click.echo("\n".join(f"{key} = {value}" for key, value in built.items()))
