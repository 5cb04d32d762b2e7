"""Camera streams: what one more viewer costs. The simulated camera at 1280x720 served as
MJPEG to 1 viewer and then to 10, in one run: frames per second each viewer gets, and the
stream service's CPU seconds per second. It captures and encodes each frame once,
whatever the number of viewers: 10 viewers should cost at most 1.3x the CPU of 1.

Usage: bench/video.py [--seconds 15] [--fps 15]
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_lab import cpu_seconds, lease_ready, local_lab  # noqa: E402

from device_loop.core.holders import listening_ports  # noqa: E402

TARGET = 1.3


def stream_pid(port: int) -> int:
    """The stream service listening on ``port`` (it holds the socket the exporter bound)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if "device_loop.plugins.video.stream" in Path(f"/proc/{pid}/cmdline").read_text() \
                    and port in listening_ports(int(pid)):
                return int(pid)
        except OSError:
            continue
    raise SystemExit(f"no stream service listens on port {port}")


def watch(url: str, seconds: float, counts: list, index: int) -> None:
    marker = b"--devloopframe\r\n"
    deadline = time.monotonic() + seconds
    with httpx2.stream("GET", url, timeout=30) as response:
        tail = b""
        for chunk in response.iter_bytes():
            counts[index] += (tail + chunk).count(marker)
            tail = chunk[-len(marker):]
            if time.monotonic() > deadline:
                return


def measure(url: str, pid: int, viewers: int, seconds: float) -> tuple[float, float]:
    """(frames per second per viewer, CPU seconds per second of the stream service)."""
    counts = [0] * viewers
    threads = [threading.Thread(target=watch, args=(url, seconds + 1, counts, i)) for i in range(viewers)]
    for thread in threads:
        thread.start()
    time.sleep(1)  # every viewer connected, the capture running
    began, cpu, before = time.monotonic(), cpu_seconds(pid), list(counts)
    time.sleep(seconds)
    took, used = time.monotonic() - began, cpu_seconds(pid) - cpu
    frames = [after - first for after, first in zip(counts, before)]
    for thread in threads:
        thread.join()
    return sum(frames) / len(frames) / took, used / took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--fps", type=int, default=15)
    args = parser.parse_args()
    board = {"name": "board", "class": "bench-board",
             "resources": [{"plugin": "sim"}, {"plugin": "video", "source": "sim", "width": 1280, "height": 720,
                                                "fps": args.fps}]}
    with local_lab([board], heartbeat_s=5.0) as lab:
        camera = next(e for e in lease_ready(lab.api, "board")["endpoints"] if e["kind"] == "video")
        url, pid = camera["url"] + "stream.mjpg", stream_pid(camera["port"])
        one = measure(url, pid, 1, args.seconds)
        ten = measure(url, pid, 10, args.seconds)
    ratio = ten[1] / one[1]
    print(f"simulated camera 1280x720 at {args.fps} fps, MJPEG, {args.seconds:g} s each (this machine: "
          f"{os.cpu_count()} cores)")
    for viewers, (fps, cpu) in ((1, one), (10, ten)):
        print(f"  {viewers:>2} viewer{'s' if viewers > 1 else ' '}  {fps:5.1f} frames/s each   "
              f"stream service CPU {cpu:.3f} s/s")
    print(f"  10 viewers cost {ratio:.2f}x the CPU of 1 (target: at most {TARGET}x): "
          + ("met" if ratio <= TARGET else "NOT MET"))


if __name__ == "__main__":
    main()
