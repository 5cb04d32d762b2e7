"""``run-workload --cost C``: a fixed amount of simulated work whose length depends on the
board's temperature, for A/B tests that must come out the same on the same seed.

A run takes ``workload_s * C * throttle(T) * (1 + e)`` seconds of wall time, really (it
sleeps, and Ctrl-C interrupts it), where ``T`` is the board's temperature when it starts,
``throttle`` is 1 below the knee ``throttle_above`` and ``throttle_per_c`` more per degree
above it (``thermal.py``), and ``e`` is drawn from a normal law of deviation ``noise``
(clipped to three deviations) by a random generator seeded with ``seed``: the n-th run of a
board powered on with a seed always draws the same ``e``. While it runs the board takes in
``work_heat`` degrees a second (``Thermal.work``). It prints one metric line,
``{"metric": "workload_ms", "value": MS, "unit": "ms"}``, where MS is the run's modelled
length: what the board was busy for, free of the host's scheduling jitter (the sleep itself
lasts as long, give or take that jitter).

So interleaving matters. A run of length ``w`` warms the board by about ``work_heat * w``;
runs back to back, ``gap`` seconds apart, heat it toward ``ambient + work_heat * w / (1 -
exp(-(w + gap) / tau))``, so the later runs of an AABB order (the B's) start hotter, above
the knee, and are throttled, while a cooldown before every run (``settle``) below the knee
starts each at full speed. On the model's clock (``tests/test_sim_shell.py``), 6 rounds and a
warmup, B at ``--cost 0.95``, ambient 40 °C, noise 1 %:

- ``workload_s = 0.1``, ``work_heat = 50`` (5 °C a run), ``tau = "8s"``, ``throttle_above =
  55``, cooldown below 53 °C: ABAB with cooldown gives B/A = 0.955 (the 5 %), its cooldowns
  some 20 s in all; AABB without, runs 0.5 s apart: 1.35 (B "slower"), still 1.05 at 1.5 s
  apart.
- the same with ``tau = "4s"``, ``throttle_above = 60``, cooldown below 58 °C: ABAB 0.955 with
  3 s of cooldown in all; AABB 1.04 with runs 0.5 s apart, but right again (0.95) from about
  a second apart: the board cools between runs before it reaches the knee.

(On a console each line entered adds ``COMMAND_HEAT_C`` too: a run's command and the
readings taken at its start warm the board some 1 °C more, which only hastens AABB's drift.)
"""
from __future__ import annotations

import random
import threading
from dataclasses import dataclass

from .thermal import DEFAULT_THROTTLE_ABOVE_C, DEFAULT_THROTTLE_PER_C, Thermal, throttle

DEFAULT_WORKLOAD_S = 1.0
DEFAULT_NOISE = 0.01
MAX_COST = 1e6


@dataclass(frozen=True)
class WorkloadModel:
    """The workload's parameters, from the board's config entry."""
    seconds: float = DEFAULT_WORKLOAD_S            # a run of cost 1 on a cool board
    throttle_above_c: float = DEFAULT_THROTTLE_ABOVE_C
    throttle_per_c: float = DEFAULT_THROTTLE_PER_C
    noise: float = DEFAULT_NOISE
    seed: int = 0


class Workload:
    """One board's workloads: their lengths, drawn in order from the board's seeded generator."""

    def __init__(self, model: WorkloadModel, thermal: Thermal):
        self.model, self.thermal = model, thermal
        self._random = random.Random(model.seed)
        self._lock = threading.Lock()  # one draw at a time, in the order the runs start

    def slowdown(self) -> float:
        """How many times longer work takes now (the current frequency is the maximum over it)."""
        return throttle(self.thermal.read(), self.model.throttle_above_c, self.model.throttle_per_c)

    def start(self, cost: float) -> float:
        """Begin a run of ``cost``: its length in seconds (the board heats for that long)."""
        with self._lock:
            e = max(-3.0, min(3.0, self._random.gauss(0.0, 1.0))) * self.model.noise
            seconds = self.model.seconds * cost * self.slowdown() * (1.0 + e)
            self.thermal.work(seconds)
        return seconds
