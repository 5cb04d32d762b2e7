"""What the tests need fetched before pytest starts, and where it is kept. ``./lab test`` runs
this (``python tests/prepare.py``; ``--fast``: only what the fast tier needs) before pytest,
once: a second run finds everything there and fetches nothing. Inside pytest nothing is
downloaded or installed: a test that finds something here missing fails (``not_prepared``),
saying what to run.

- The VM tests' guests (tests/qemu_guests.py): each architecture's Debian packages (a kernel,
  busybox-static, dropbear and the libraries it loads) fetched with ``apt-get download`` and
  unpacked, and the guests' host key made (plugins/qemu/guest.py, ``fetch_guest``). A session
  builds its initramfs from them (a fraction of a CPU-second each, no apt), with its own ssh key.
- The JUnit schema Jenkins and GitLab read (tests/junit_schema.py), from pytest's sdist on PyPI.

They are kept in the venv's ``share/device-loop-tests`` (./lab owns the venv);
``$DEVICE_LOOP_TEST_GUEST_CACHE`` keeps the guests' packages elsewhere.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import NoReturn

FOLDER = Path(sys.prefix) / "share" / "device-loop-tests"
GUEST_CACHE_ENV = "DEVICE_LOOP_TEST_GUEST_CACHE"
#: apt's package lists: when they change, apt may name another kernel than the one fetched
APT_LISTS = Path("/var/lib/apt/lists")
JUNIT_XSD_MEMBER = "testing/example_scripts/junit-10.xsd"
PIP_TIMEOUT_S = 300


def guest_cache() -> Path:
    """The folder the VM guests' packages are fetched into: ``$DEVICE_LOOP_TEST_GUEST_CACHE``,
    else the venv's ``share/device-loop-tests/guests``."""
    return Path(os.environ.get(GUEST_CACHE_ENV) or FOLDER / "guests")


def junit_xsd_path() -> Path:
    """Where junit-10.xsd is kept: named by the installed pytest's version, whose sdist it comes from."""
    return FOLDER / f"junit-10-pytest-{version('pytest')}.xsd"


def not_prepared(what: str, why: str) -> NoReturn:
    """Fail the test (neither skip it nor fetch ``what`` here): ``what`` is not prepared."""
    import pytest

    pytest.fail(f"not prepared: {what} ({why}). ./lab test fetches what the tests need before pytest starts "
                f"(alone: {sys.executable} {Path(__file__).resolve()})", pytrace=False)


def apt_lists_state() -> str:
    """A digest of apt's package lists as they are now (each list's name, size and time)."""
    try:
        lists = sorted(f"{path.name} {info.st_size} {info.st_mtime_ns}"
                       for path in APT_LISTS.glob("*_Packages*") for info in [path.stat()])
    except OSError:
        lists = []
    return hashlib.sha256("\n".join(lists).encode()).hexdigest()


def prepare_guests(cache: Path) -> bool:
    """Every architecture's guest packages (ssh's too) fetched and unpacked into ``cache``;
    apt is asked which kernel is current only when its package lists changed since it last
    was (``cache/apt-lists``). Whether apt was asked."""
    from device_loop.plugins.qemu.guest import ARCHES, GuestNotFetched, fetch_guest  # (--fast needs none of it)

    stamp = cache / "apt-lists"
    lists = apt_lists_state()
    if stamp.is_file() and stamp.read_text().strip() == lists:
        try:
            for arch in ARCHES:
                fetch_guest(arch, cache, ssh=True, fetch=False)
            return False
        except GuestNotFetched:
            pass
    print(f"tests/prepare.py: fetching the VM guests' Debian packages into {cache} (what is not there yet)",
          file=sys.stderr, flush=True)
    for arch in ARCHES:
        fetch_guest(arch, cache, ssh=True)
    stamp.write_text(lists + "\n")
    return True


def prepare_junit_xsd() -> bool:
    """junit-10.xsd taken from the installed pytest's sdist (fetched from PyPI with pip), unless
    it is there already. Whether it was fetched."""
    where = junit_xsd_path()
    if where.is_file():
        return False
    print(f"tests/prepare.py: fetching the JUnit schema (pytest {version('pytest')}'s sdist) into {where}",
          file=sys.stderr, flush=True)
    where.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                        "--no-deps", "--no-binary", ":all:", "--dest", folder, f"pytest=={version('pytest')}"],
                       check=True, timeout=PIP_TIMEOUT_S)
        sdist = next(Path(folder).glob("pytest-*.tar.gz"), None)
        if sdist is None:
            raise FileNotFoundError(f"pip download pytest=={version('pytest')} gave no sdist")
        with tarfile.open(sdist) as archive:
            named = f"{sdist.name.removesuffix('.tar.gz')}/{JUNIT_XSD_MEMBER}"
            member = archive.extractfile(named) if named in archive.getnames() else None
            if member is None:
                raise FileNotFoundError(f"{sdist.name} holds no {JUNIT_XSD_MEMBER}")
            data = member.read()
    partial = where.with_suffix(f".{os.getpid()}.part")
    partial.write_bytes(data)
    partial.replace(where)
    return True


def main(argv: list[str] | None = None) -> int:
    """Prepare what the tests need; say what was fetched, and how long it took."""
    parser = argparse.ArgumentParser(description="fetch what the tests need before pytest starts")
    parser.add_argument("--fast", action="store_true", help="only what the fast tier needs (no VM guests)")
    args = parser.parse_args(argv)
    began = time.monotonic()
    try:
        fetched = prepare_junit_xsd()
    except (OSError, subprocess.SubprocessError, tarfile.TarError) as exc:
        return failed("the JUnit schema", exc)
    if not args.fast:
        from device_loop.plugins.qemu.guest import GuestError

        try:
            fetched = prepare_guests(guest_cache()) or fetched
        except (GuestError, OSError) as exc:
            return failed("the VM guests' packages", exc)
    if fetched:
        print(f"tests/prepare.py: ready in {time.monotonic() - began:.0f} s", file=sys.stderr)
    return 0


def failed(what: str, exc: Exception) -> int:
    print(f"tests/prepare.py: {what} could not be fetched: {exc}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
