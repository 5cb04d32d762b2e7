"""A disk image never makes a tool open a path of the host (docs/architecture.md, "Virtual
devices"): each trick a user may hide in a qcow2's header is refused by ``disk_problem``,
read from the bytes before any tool opens the file, and by the registry at upload. The
images are made by the real ``qemu-img``; its header then patched the way an attacker would."""
from __future__ import annotations

import io
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from device_loop.core.disk_images import QCOW2_MAGIC, DiskFormat, disk_format, disk_problem, image_problem

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]
SECRET = "/etc/device-loop/exporter.token"


def qemu_img(*args: str) -> None:
    assert shutil.which("qemu-img"), "qemu-img is not installed (./lab test installs qemu-utils)"
    subprocess.run(["qemu-img", *args], check=True, timeout=60, capture_output=True)


def patched(image: Path, old: bytes, new: bytes) -> None:
    """Put ``new`` where the header says ``old``, padded to its length: the file named is
    then any file of the host (qemu-img refuses to make an image over a file it cannot read)."""
    data = image.read_bytes()
    at = data.index(old)
    image.write_bytes(data[:at] + new.ljust(len(old), b"\0") + data[at + len(old):])


@pytest.fixture
def images(tmp_path: Path) -> Path:
    qemu_img("create", "-q", "-f", "raw", str(tmp_path / "base.raw"), "1M")
    return tmp_path


def test_a_whole_qcow2_and_a_raw_image_may_be_booted(images):
    qemu_img("create", "-q", "-f", "qcow2", str(images / "v3.qcow2"), "16M")
    qemu_img("create", "-q", "-f", "qcow2", "-o", "compat=0.10", str(images / "v2.qcow2"), "16M")
    for name, fmt in [("v3.qcow2", DiskFormat.QCOW2), ("v2.qcow2", DiskFormat.QCOW2), ("base.raw", DiskFormat.RAW)]:
        assert (disk_format(images / name), disk_problem(images / name)) == (fmt, None), name


def test_a_backing_file_is_refused(images):
    qemu_img("create", "-q", "-f", "qcow2", "-b", str(images / "base.raw"), "-F", "raw", str(images / "over.qcow2"))
    problem = disk_problem(images / "over.qcow2")
    assert problem and "backing file" in problem and "base.raw" in problem, problem


def test_a_chain_is_refused_at_its_first_link(images):
    qemu_img("create", "-q", "-f", "qcow2", str(images / "whole.qcow2"), "16M")
    qemu_img("create", "-q", "-f", "qcow2", "-b", str(images / "whole.qcow2"), "-F", "qcow2", str(images / "mid.qcow2"))
    qemu_img("create", "-q", "-f", "qcow2", "-b", str(images / "mid.qcow2"), "-F", "qcow2", str(images / "top.qcow2"))
    assert "backing file" in (disk_problem(images / "top.qcow2") or "")
    assert "backing file" in (disk_problem(images / "mid.qcow2") or "")


@pytest.mark.parametrize("raw_data", [True, False])
def test_an_external_data_file_patched_to_name_a_host_file_is_refused(images, raw_data):
    """The probe's trick: ``data_file=PATH,data_file_raw=on``, the path then patched to a host file."""
    decoy = images / "decoy.raw"
    qemu_img("create", "-q", "-f", "raw", str(decoy), "1M")
    options = f"data_file={decoy}" + (",data_file_raw=on" if raw_data else "")
    qemu_img("create", "-q", "-f", "qcow2", "-o", options, str(images / "data.qcow2"), "1M")
    patched(images / "data.qcow2", str(decoy).encode(), SECRET.encode())
    problem = disk_problem(images / "data.qcow2")
    assert problem and "external data file" in problem and SECRET in problem, problem


def test_a_data_file_extension_without_its_feature_bit_is_refused_too(images):
    """The extension alone names the file; refused whatever the flags say."""
    decoy = images / "decoy.raw"
    qemu_img("create", "-q", "-f", "raw", str(decoy), "1M")
    qemu_img("create", "-q", "-f", "qcow2", "-o", f"data_file={decoy}", str(images / "data.qcow2"), "1M")
    data = bytearray((images / "data.qcow2").read_bytes())
    data[72:80] = struct.pack(">Q", struct.unpack(">Q", data[72:80])[0] & ~(1 << 2))  # the incompatible bit cleared
    (images / "data.qcow2").write_bytes(bytes(data))
    assert "external data file" in (disk_problem(images / "data.qcow2") or "")


def test_a_raw_image_that_looks_like_a_qcow2_is_read_as_one_and_refused(images):
    """Uploaded as a 'raw' disk, its first bytes are a qcow2's that name a data file: it is a
    qcow2 to QEMU's probe, so it is one to the check (the format is stated, never probed)."""
    decoy = images / "decoy.raw"
    qemu_img("create", "-q", "-f", "raw", str(decoy), "1M")
    qemu_img("create", "-q", "-f", "qcow2", "-o", f"data_file={decoy},data_file_raw=on", str(images / "x.qcow2"), "1M")
    looks_raw = images / "disk.img"
    looks_raw.write_bytes((images / "x.qcow2").read_bytes() + b"\0" * 4096)
    assert disk_format(looks_raw) == DiskFormat.QCOW2
    assert "external data file" in (disk_problem(looks_raw) or "")


def test_an_encrypted_or_unknown_qcow2_is_refused(images):
    qemu_img("create", "-q", "-f", "qcow2", "--object", "secret,id=s0,data=x", "-o",
             "encrypt.format=aes,encrypt.key-secret=s0", str(images / "enc.qcow2"), "1M")
    assert "encrypted" in (disk_problem(images / "enc.qcow2") or "")
    qemu_img("create", "-q", "-f", "qcow2", str(images / "v3.qcow2"), "1M")
    data = bytearray((images / "v3.qcow2").read_bytes())
    data[4:8] = struct.pack(">I", 4)
    assert "version 4" in (image_problem(io.BytesIO(bytes(data))) or "")
    data[4:8] = struct.pack(">I", 3)
    data[72:80] = struct.pack(">Q", 1 << 40)
    assert "features this check does not know" in (image_problem(io.BytesIO(bytes(data))) or "")


def test_a_vmdk_descriptor_is_a_raw_image_of_its_own_bytes(images):
    """A text that QEMU's probe would read as a VMDK naming extents on the host: no qcow2
    magic, so it is raw, handed to QEMU as raw (its bytes are what the guest reads)."""
    text = images / "disk.vmdk"
    text.write_text(f'# Disk DescriptorFile\nversion=1\ncreateType="monolithicFlat"\nRW 8 FLAT "{SECRET}" 0\n')
    assert (disk_format(text), disk_problem(text)) == (DiskFormat.RAW, None)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=600))
def test_any_bytes_after_the_magic_give_a_verdict_never_an_exception(tail):
    problem = image_problem(io.BytesIO(QCOW2_MAGIC + tail))
    assert problem is None or isinstance(problem, str)
