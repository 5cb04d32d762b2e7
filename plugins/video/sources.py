"""Where frames come from: a simulated camera, or anything OpenCV can open (a V4L2 device
node, a video file, a network stream). Used by the stream service, one source a lease."""
from __future__ import annotations

import os
import time
from pathlib import Path

import cv2
import numpy as np


class SourceFailed(Exception):
    """The source stopped giving frames (unplugged, unreadable); the message says why."""


class SimSource:
    """A moving pattern with the board's name, a frame counter and the time drawn on it.

    ``fail_switch``: while that file exists the camera fails, with the file's text as the
    reason (a test's way to unplug it: a deleted video file keeps reading on Linux).
    """

    def __init__(self, name: str, width: int, height: int, fail_switch: str | None = None):
        self.name, self.width, self.height = name, width, height
        self.fail_switch = Path(fail_switch) if fail_switch else None
        self.count = 0
        x = np.linspace(0, 255, width, dtype=np.float32)
        y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
        self._base = np.dstack([np.broadcast_to(x, (height, width)), np.broadcast_to(y, (height, width)),
                                np.full((height, width), 96, np.float32)]).astype(np.uint8)

    def read(self) -> np.ndarray:
        if self.fail_switch is not None and self.fail_switch.exists():
            raise SourceFailed(self.fail_switch.read_text().strip() or "the simulated camera was unplugged")
        self.count += 1
        frame = np.roll(self._base, (self.count * 4) % self.width, axis=1)
        scale = self.height / 360
        for row, text in enumerate((self.name, f"frame {self.count}", time.strftime("%H:%M:%S"))):
            cv2.putText(frame, text, (int(20 * scale), int((60 + 50 * row) * scale)), cv2.FONT_HERSHEY_SIMPLEX,
                        1.2 * scale, (255, 255, 255), max(1, int(2 * scale)), cv2.LINE_AA)
        return frame

    def close(self) -> None:
        pass


class CaptureSource:
    """A device node, a video file (played in a loop) or a stream URL, through OpenCV."""

    def __init__(self, where: str, width: int, height: int):
        self.where, self.width, self.height = where, width, height
        self.looping = os.path.isfile(where)
        self.capture = cv2.VideoCapture(where)
        if not self.capture.isOpened():
            raise SourceFailed(f"cannot open {where}")
        if not self.looping:  # a camera may give the size asked for
            self.capture.set(cv2.CAP_PROP_FRAME_WIDTH, width)
            self.capture.set(cv2.CAP_PROP_FRAME_HEIGHT, height)

    def read(self) -> np.ndarray:
        ok, frame = self.capture.read()
        if not ok and self.looping:
            self.capture.set(cv2.CAP_PROP_POS_FRAMES, 0)
            ok, frame = self.capture.read()
        if not ok:
            raise SourceFailed(f"{self.where} gives no more frames (unplugged, or unreadable)")
        if frame.shape[1] != self.width or frame.shape[0] != self.height:
            frame = cv2.resize(frame, (self.width, self.height), interpolation=cv2.INTER_AREA)
        return frame

    def close(self) -> None:
        self.capture.release()


def open_source(kind: str, where: str, name: str, width: int, height: int, fail_switch: str | None):
    return SimSource(name, width, height, fail_switch) if kind == "sim" else CaptureSource(where, width, height)
