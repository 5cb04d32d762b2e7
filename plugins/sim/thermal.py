"""A simulated board's temperature: one zone, ``cpu``, warmed by the work its console does
and cooling toward the room it stands in.

Newton's law both ways: the temperature relaxes exponentially toward a target, the ambient
with time constant ``tau_s`` when idle, ``ambient + STRESS_RISE_C`` with ``STRESS_TAU_S``
while ``stress`` runs. Each console command handled adds ``COMMAND_HEAT_C``. The model
holds its last value and when it was taken, and every reading is a pure function of them
and the time elapsed (``relax``), so a test reads the clock it is given instead of
sleeping.

With the defaults (40 °C, tau 17 s) a 5-second ``stress`` brings the board to about 69 °C,
and it is below 45 °C again some 30 seconds after the stress ended.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Callable

DEFAULT_AMBIENT_C = 40.0
DEFAULT_TAU_S = 17.0  # ambient + 30 °C cools below ambient + 5 °C in tau * ln 6, about 30 s
STRESS_RISE_C = 32.0  # where a stressed board's temperature heads, above the ambient
STRESS_TAU_S = 2.0    # how fast it heads there: 5 s of stress make it some 29 °C
COMMAND_HEAT_C = 0.5  # what one console command warms the board by
DEFAULT_STRESS_S = 5.0
MAX_STRESS_S = 600.0


def relax(temperature: float, toward: float, elapsed: float, tau_s: float) -> float:
    """The temperature ``elapsed`` seconds on, heading for ``toward`` with time constant ``tau_s``."""
    return toward + (temperature - toward) * math.exp(-max(0.0, elapsed) / tau_s)


class Thermal:
    """One board's temperature (°C). ``clock`` is ``time.monotonic`` unless a test gives its own."""

    def __init__(self, ambient_c: float = DEFAULT_AMBIENT_C, tau_s: float = DEFAULT_TAU_S,
                 clock: Callable[[], float] = time.monotonic):
        if tau_s <= 0:
            raise ValueError(f"tau must be positive, not {tau_s!r}")
        self.ambient_c, self.tau_s, self.clock = ambient_c, tau_s, clock
        self._lock = threading.Lock()  # the console's thread heats it, the exporter's threads read it
        self._temperature = ambient_c
        self._at = clock()
        self._stress_until = self._at

    def read(self) -> float:
        """The temperature now."""
        with self._lock:
            return self._advance()

    def heat(self, degrees: float = COMMAND_HEAT_C) -> None:
        """A burst of work (a console command handled) warms the board at once."""
        with self._lock:
            self._temperature = self._advance() + degrees

    def stress(self, seconds: float = DEFAULT_STRESS_S) -> None:
        """Load the board for ``seconds`` from now (a stress already running runs until the later end)."""
        with self._lock:
            self._advance()
            self._stress_until = max(self._stress_until, self._at + seconds)

    def stressed(self) -> bool:
        with self._lock:
            return self.clock() < self._stress_until

    def _advance(self) -> float:
        """Bring the held value up to now (the lock held): heating while stressed, then cooling."""
        now = self.clock()
        if now > self._at and self._stress_until > self._at:
            until = min(now, self._stress_until)
            self._temperature = relax(self._temperature, self.ambient_c + STRESS_RISE_C, until - self._at,
                                      STRESS_TAU_S)
            self._at = until
        if now > self._at:
            self._temperature = relax(self._temperature, self.ambient_c, now - self._at, self.tau_s)
            self._at = now
        return self._temperature
