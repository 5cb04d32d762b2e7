"""A job's runs as a chart (docs/architecture.md, "Jobs and evidence"): per cell and metric,
each run's value in run order, A and B in two colours and warmup greyed, marked runs hollow,
the start temperature on a second axis, so a reader sees drift and what interleaving did.

One layout (``layout``), drawn twice: as inline SVG for the job's web page (``svg``) and as
a PNG for ``--plot`` (``png``) with OpenCV, already a dependency for the cameras: its
Hershey fonts draw ASCII only, which the labels are reduced to there. Every label comes
from users, workers or exporters: the SVG escapes it, and neither drawing reads markup.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from xml.sax.saxutils import escape

from device_loop.core.ab.abstats import Analysis, run_value, start_temperature
from device_loop.core.ab.evidence import number, plain
from device_loop.core.ab.jobs import JobView, RunRecord
from device_loop.core.vocabulary import Arm

WIDTH = 720
PANEL_HEIGHT = 200
LEFT, RIGHT, TOP, BOTTOM = 64.0, 56.0, 34.0, 30.0
LEGEND_HEIGHT = 24.0
MAX_PANELS = 64
MAX_LABEL = 90
Kind = Literal["A", "B", "run", "warmup"]
COLOURS: dict[str, tuple[int, int, int]] = {           # RGB
    "A": (31, 119, 180), "B": (255, 127, 14), "run": (31, 119, 180), "warmup": (176, 176, 176),
    "temperature": (214, 39, 40), "axis": (90, 90, 90), "text": (30, 30, 30), "grid": (225, 225, 225),
}


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    kind: Kind
    hollow: bool                     # a run marked unfit to measure


@dataclass(frozen=True)
class Label:
    x: float
    y: float
    text: str
    anchor: Literal["start", "middle", "end"] = "start"
    colour: str = "text"


@dataclass(frozen=True)
class Panel:
    left: float
    top: float
    right: float
    bottom: float
    points: tuple[Point, ...]
    temperature: tuple[tuple[float, float], ...]
    labels: tuple[Label, ...]


@dataclass(frozen=True)
class Figure:
    width: float
    height: float
    title: str
    panels: tuple[Panel, ...]
    legend: tuple[tuple[str, str], ...]          # (colour, text)
    note: str = ""                               # what was left out


def _span(values: list[float]) -> tuple[float, float]:
    low, high = min(values), max(values)
    pad = (high - low) * 0.08 or abs(high) * 0.05 or 1.0
    return low - pad, high + pad


def _kind(run: RunRecord) -> Kind:
    if run.warmup:
        return "warmup"
    return "A" if run.arm is Arm.A else "B" if run.arm is Arm.B else "run"


def _panel(top: float, title: str, runs: list[RunRecord], metric: str, unit: str) -> Panel | None:
    measured = [(r, v) for r in runs if r.status == 0 and (v := run_value(r, metric)) is not None]
    if not measured:
        return None
    left, right, bottom = LEFT, WIDTH - RIGHT, top + PANEL_HEIGHT - BOTTOM
    inner_top = top + TOP
    seqs = [float(r.seq) for r in runs]
    x_low, x_high = min(seqs) - 0.5, max(seqs) + 0.5
    y_low, y_high = _span([v for _, v in measured])

    def x(seq: float) -> float:
        return left + (seq - x_low) / (x_high - x_low) * (right - left)

    def y(value: float, low: float, high: float) -> float:
        return bottom - (value - low) / (high - low) * (bottom - inner_top)

    points = tuple(Point(x(r.seq), y(v, y_low, y_high), _kind(r), bool(r.readings.unfit)) for r, v in measured)
    temps = [(float(r.seq), t) for r in runs if (t := start_temperature(r)) is not None]
    labels = [Label(left, top + 16, plain(title)[:MAX_LABEL]),
              Label(left - 6, inner_top + 4, number(y_high, plain(unit)), "end"),
              Label(left - 6, bottom, number(y_low, plain(unit)), "end"),
              Label(left, bottom + 16, f"run {min(seqs):g}"),
              Label(right, bottom + 16, f"run {max(seqs):g}", "end")]
    line: tuple[tuple[float, float], ...] = ()
    if temps:
        t_low, t_high = _span([t for _, t in temps])
        line = tuple((x(s), y(t, t_low, t_high)) for s, t in temps)
        labels += [Label(right + 6, inner_top + 4, f"{t_high:.1f} °C", colour="temperature"),
                   Label(right + 6, bottom, f"{t_low:.1f} °C", colour="temperature")]
    return Panel(left, inner_top, right, bottom, points, line, tuple(labels))


def layout(job: JobView, analysis: Analysis) -> Figure:
    """Where everything goes: a panel per cell and metric that has values, at most MAX_PANELS."""
    matrix = len(analysis.cells) > 1
    wanted = []
    _, last = job.last_attempts()  # (each cell's last attempt, as the analysis on the chart: "Lab failures")
    for cell in analysis.cells:
        runs = sorted((r for r in last if r.cell == cell.cell), key=lambda r: r.seq)
        where = " ".join(filter(None, [cell.device or "", f"({cell.group})" if matrix and cell.group else ""]))
        for metric in cell.metrics:
            title = f"{metric.name}" + (f" ({metric.unit})" if metric.unit else "") + (f" on {where}" if where else "")
            wanted.append((title, runs, metric.name, metric.unit))
    panels: list[Panel] = []
    top = LEGEND_HEIGHT
    skipped = 0
    for title, runs, name, unit in wanted:
        if len(panels) == MAX_PANELS:
            skipped += 1
            continue
        panel = _panel(top, title, runs, name, unit)
        if panel is not None:
            panels.append(panel)
            top += PANEL_HEIGHT
    legend: tuple[tuple[str, str], ...] = (("A", "A (baseline)"), ("B", "B (patch)")) if analysis.ab else \
        (("run", "run"),)
    legend += (("warmup", "warmup"), ("temperature", "start temperature (right axis)"))
    note = f"{skipped} more panels not drawn" if skipped else ""
    return Figure(WIDTH, max(top, LEGEND_HEIGHT + 40) + (16 if note else 0),
                  plain(job.spec.title or f"job {job.id}")[:MAX_LABEL], tuple(panels), legend, note)


# --- SVG ----------------------------------------------------------------------------------------

def _hex(colour: str) -> str:
    r, g, b = COLOURS[colour]
    return f"#{r:02x}{g:02x}{b:02x}"


def _text(label: Label, size: int = 11) -> str:
    return (f'<text x="{label.x:.1f}" y="{label.y:.1f}" font-size="{size}" text-anchor="{label.anchor}" '
            f'fill="{_hex(label.colour)}">{escape(plain(label.text))}</text>')


def svg(job: JobView, analysis: Analysis) -> str:
    """The chart as one inline ``<svg>`` element (every label escaped)."""
    figure = layout(job, analysis)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{figure.width:.0f}" height="{figure.height:.0f}" '
           f'viewBox="0 0 {figure.width:.0f} {figure.height:.0f}" font-family="sans-serif" role="img">',
           f"<title>{escape(figure.title)}: runs in order, with start temperature</title>"]
    x = LEFT
    for colour, text in figure.legend:
        out.append(f'<circle cx="{x:.1f}" cy="12" r="4" fill="{_hex(colour)}"/>')
        out.append(_text(Label(x + 8, 16, text)))
        x += 8 + 7 * len(text) + 18
    for panel in figure.panels:
        out.append(f'<rect x="{panel.left:.1f}" y="{panel.top:.1f}" width="{panel.right - panel.left:.1f}" '
                   f'height="{panel.bottom - panel.top:.1f}" fill="none" stroke="{_hex("axis")}"/>')
        if panel.temperature:
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py in panel.temperature)
            out.append(f'<polyline points="{path}" fill="none" stroke="{_hex("temperature")}" '
                       'stroke-width="1.2" stroke-dasharray="4 3"/>')
        for p in panel.points:
            fill = "none" if p.hollow else _hex(p.kind)
            out.append(f'<circle cx="{p.x:.1f}" cy="{p.y:.1f}" r="3.5" fill="{fill}" stroke="{_hex(p.kind)}"/>')
        out += [_text(label, 12 if i == 0 else 10) for i, label in enumerate(panel.labels)]
    if figure.note:
        out.append(_text(Label(LEFT, figure.height - 4, figure.note)))
    out.append("</svg>")
    return "\n".join(out)


# --- PNG ----------------------------------------------------------------------------------------

def _ascii(text: str) -> str:
    return plain(text).replace("°", "").encode("ascii", "replace").decode("ascii")


def png(job: JobView, analysis: Analysis, path: str | Path, scale: int = 2) -> None:
    """The chart as a PNG file at ``path`` (``--plot FILE.png``), ``scale`` times the SVG's size."""
    import cv2
    import numpy as np

    figure = layout(job, analysis)
    image = np.full((math.ceil(figure.height * scale), math.ceil(figure.width * scale), 3), 255, np.uint8)

    def at(x: float, y: float) -> tuple[int, int]:
        return round(x * scale), round(y * scale)

    def bgr(colour: str) -> tuple[int, int, int]:
        r, g, b = COLOURS[colour]
        return b, g, r

    def text(label: Label, size: float = 0.4) -> None:
        words = _ascii(label.text)
        (width, _), _ = cv2.getTextSize(words, cv2.FONT_HERSHEY_SIMPLEX, size * scale, 1)
        shift = {"start": 0, "middle": width / 2, "end": width}[label.anchor]
        x, y = at(label.x, label.y)
        cv2.putText(image, words, (round(x - shift), y), cv2.FONT_HERSHEY_SIMPLEX, size * scale, bgr(label.colour),
                    1, cv2.LINE_AA)

    x = LEFT
    for colour, words in figure.legend:
        cv2.circle(image, at(x, 12), 4 * scale, bgr(colour), -1, cv2.LINE_AA)
        text(Label(x + 8, 16, words))
        x += 8 + 7 * len(words) + 18
    for panel in figure.panels:
        cv2.rectangle(image, at(panel.left, panel.top), at(panel.right, panel.bottom), bgr("axis"), 1)
        if len(panel.temperature) > 1:
            line = np.array([at(px, py) for px, py in panel.temperature], np.int32)
            cv2.polylines(image, [line], False, bgr("temperature"), max(1, scale // 2), cv2.LINE_AA)
        for p in panel.points:
            cv2.circle(image, at(p.x, p.y), round(3.5 * scale), bgr(p.kind), 1 if p.hollow else -1, cv2.LINE_AA)
        for i, label in enumerate(panel.labels):
            text(label, 0.45 if i == 0 else 0.36)
    if figure.note:
        text(Label(LEFT, figure.height - 4, figure.note))
    ok, encoded = cv2.imencode(".png", image)
    if not ok:
        raise OSError("could not encode the chart as PNG")
    Path(path).write_bytes(encoded.tobytes())
