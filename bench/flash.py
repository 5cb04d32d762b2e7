"""Mediated flash with big images: each phase beside the plain tool doing the same job,
measured in the same run, and the memory the processes need for it.

- fetch: the exporter fetches the image from the coordinator's registry into its cache
  (sha256 checked on the way) vs ``curl`` of the same file from a static HTTP server
  (``python3 -m http.server``), written to the same disk;
- write + verify: the flash plugin streams the cached image onto a file target, syncs it
  and reads it back from the disk to hash it vs ``dd bs=4M conv=fsync`` followed by
  ``sha256sum`` of the target;
- memory: the peak resident memory (VmHWM) of the coordinator and of the exporter, fresh
  processes for each size, after the upload and a first flash of a small image and of a
  big one: it must not grow with the image.

Phases are timed by the exporter (the operation's ``seconds``), as the tools are timed
from their start to their end; the whole, from request to result, is printed too.
Usage: bench/flash.py [--size-mib 1024] [--small-mib 256]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_lab import lease_ready, local_lab, memory_mib  # noqa: E402

from device_loop.core.ports import free_port, wait_port_open  # noqa: E402
from device_loop.core import LIVE_OP_STATES  # noqa: E402
from device_loop.core.files import file_sha256  # noqa: E402

TARGET_RATIO = 0.8  # each phase at least this fast, relative to its plain tool
REPEATS = 5  # each phase and its tool, in turns: the medians are compared


def make_image(path: Path, mib: int) -> None:
    with open(path, "wb") as out:
        for _ in range(mib):
            out.write(os.urandom(1 << 20))


def timed(argv: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - began


def curl_from_static_server(image: Path, out: Path) -> float:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory",
                               str(image.parent), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port_open("127.0.0.1", port, timeout=10)
        seconds = timed(["curl", "-sS", "-o", str(out), f"http://127.0.0.1:{port}/{image.name}"])
        os.sync()
        out.unlink()
        return seconds
    finally:
        server.terminate()
        server.wait()


def flash_once(lab, lease: dict, image: str) -> dict:
    """Flash ``image``: the seconds the exporter says it spent fetching and writing +
    verifying, the whole from request to result, and the oldest the exporter's last
    heartbeat was meanwhile (it sends one a second)."""
    began = time.perf_counter()
    op = lab.api.post(f"/leases/{lease['id']}/flash", json={"image": image}).json()
    oldest = 0.0
    while op["state"] in LIVE_OP_STATES:
        op = lab.api.get(f"/ops/{op['id']}", params={"wait": 0.5, "unless": op["state"]}).json()
        oldest = max(oldest, lab.api.get("/hosts").json()[0]["heartbeat_age_s"])
    if op["state"] != "done":
        raise SystemExit(f"the flash failed: {op['message']}")
    took = op["seconds"]
    return {"fetch": took.get("fetching", 0.0), "write_verify": took.get("writing", 0.0) + took.get("verifying", 0.0),
            "whole": time.perf_counter() - began, "heartbeat_age": oldest}


def run(work: Path, mib: int, baselines: bool) -> dict:
    image = work / f"image-{mib}.img"
    make_image(image, mib)
    target = work / "target.img"
    target.write_bytes(b"")
    board = {"name": "board", "class": "bench-board",
             "resources": [{"plugin": "sim"}, {"plugin": "flash", "target": str(target)}]}
    out: dict = {}
    with local_lab([board], heartbeat_s=1.0) as lab:
        with open(image, "rb") as data:
            made = lab.api.post("/images", params={"name": f"build-{mib}", "for": "bench-board"},
                                content=iter(lambda: data.read(1 << 20), b""), timeout=600)
        assert made.status_code == 201, made.text
        sha = made.json()["sha256"]
        stored = lab.folder / "coord" / "images" / sha
        lease = lease_ready(lab.api, "board")
        cached = lab.folder / "exporter" / "images" / sha
        flash_once(lab, lease, f"build-{mib}")
        # upload and one flash, in fresh processes: what they need for an image of this size
        out["peak_coordinator"] = memory_mib(lab.coordinator, "VmHWM")
        out["peak_exporter"] = memory_mib(lab.exporter, "VmHWM")
        cached.unlink()  # the turns below fetch it again
        for _ in range(REPEATS if baselines else 0):  # each phase beside its tool, in turns
            os.sync()  # each starts with no earlier write still going to the disk
            out.setdefault("curl", []).append(curl_from_static_server(stored, lab.folder / "curl.out"))
            os.sync()
            for phase, seconds in flash_once(lab, lease, f"build-{mib}").items():
                out.setdefault(phase, []).append(seconds)
            if file_sha256(target) != sha:
                raise SystemExit("the target does not hold the image")
            plain = lab.folder / "dd-target.img"
            os.sync()
            out.setdefault("dd_sha256sum", []).append(
                timed(["dd", f"if={cached}", f"of={plain}", "bs=4M", "conv=fsync"]) + timed(["sha256sum", str(plain)]))
            plain.unlink()
            cached.unlink()  # fetched again in the next turn (the files each tool wrote are gone too)
        flash_once(lab, lease, f"build-{mib}")
        out["again"] = flash_once(lab, lease, f"build-{mib}")  # from the cache
    image.unlink()
    target.unlink()
    return out


def spread(values: list[float]) -> str:
    return "/".join(f"{v:.2f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--small-mib", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="devloop-flash-bench-", dir="/var/tmp") as folder:
        small = run(Path(folder), args.small_mib, baselines=False)
        big = run(Path(folder), args.size_mib, baselines=True)
    size = args.size_mib
    fetch, curl = median(big["fetch"]), median(big["curl"])
    write, plain = median(big["write_verify"]), median(big["dd_sha256sum"])
    fetch_ratio, write_ratio = curl / fetch, plain / write
    print(f"image of {size} MiB (this machine: {os.cpu_count()} cores); medians of {REPEATS} turns each")
    print(f"  fetch into the exporter's cache   {fetch:6.2f} s   curl from a static server "
          f"{curl:6.2f} s   ratio {fetch_ratio:.2f}x  (all: {spread(big['fetch'])} vs {spread(big['curl'])})")
    print(f"  write + verify (file target)      {write:6.2f} s   dd conv=fsync + sha256sum "
          f"{plain:6.2f} s   ratio {write_ratio:.2f}x  (all: {spread(big['write_verify'])} vs "
          f"{spread(big['dd_sha256sum'])})")
    print(f"  the whole flash, request to result {median(big['whole']):5.2f} s   (all: {spread(big['whole'])})")
    print(f"  oldest heartbeat during a flash   {max(big['heartbeat_age']):6.1f} s   (the exporter sends one a second)")
    print(f"  the same flash again (cached)     fetch {big['again']['fetch']:.2f} s, write + verify "
          f"{big['again']['write_verify']:.2f} s")
    for who in ("coordinator", "exporter"):
        grew = big[f"peak_{who}"] - small[f"peak_{who}"]
        print(f"  peak memory of the {who:<11}  {small[f'peak_{who}']:6.1f} MiB at {args.small_mib} MiB, "
              f"{big[f'peak_{who}']:6.1f} MiB at {size} MiB ({grew:+.1f} MiB)")
    ok = (fetch_ratio >= TARGET_RATIO and write_ratio >= TARGET_RATIO
          and all(abs(big[f"peak_{w}"] - small[f"peak_{w}"]) <= 10 for w in ("coordinator", "exporter")))
    print(f"targets (each phase >= {TARGET_RATIO}x its tool, peak memory within 10 MiB): "
          + ("met" if ok else "NOT MET"))


if __name__ == "__main__":
    main()
