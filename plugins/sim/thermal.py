"""A simulated board's temperature: one zone, ``cpu``, warmed by the work its console does
and cooling toward the room it stands in; and how much slower that heat makes its work.

Newton's law both ways: the temperature relaxes exponentially toward a target, the ambient
with time constant ``tau_s`` when idle, ``ambient + STRESS_RISE_C`` with ``STRESS_TAU_S``
while ``stress`` runs. While ``run-workload`` works (``work``) the board takes in
``work_heat_c_per_s`` degrees a second as it cools, dT/dt = P - (T - ambient) / tau: it
relaxes toward ``ambient + P * tau`` with ``tau``, so a short run warms it by about P times
its length. Each console command handled adds ``COMMAND_HEAT_C``. The model holds its last
value and when it was taken, and every reading is a pure function of them and the time
elapsed (``relax``), so a test reads the clock it is given instead of sleeping.

``throttle(T)`` is what a phone's thermal governor does to the clock: 1 up to the knee
(``throttle_above``), then ``throttle_per_c`` slower per degree above it (2 % by default),
so work takes that much longer and the current frequency drops by as much.

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
DEFAULT_WORK_HEAT_C_PER_S = 4.0  # what a second of run-workload puts in: a 1 s run warms it some 4 °C
DEFAULT_THROTTLE_ABOVE_C = 50.0  # the knee: work runs at full speed below it
DEFAULT_THROTTLE_PER_C = 0.02    # 2 % slower per degree above the knee
DEFAULT_STRESS_S = 5.0
MAX_STRESS_S = 600.0


def throttle(temperature: float, above_c: float = DEFAULT_THROTTLE_ABOVE_C,
             per_c: float = DEFAULT_THROTTLE_PER_C) -> float:
    """How many times longer work takes at ``temperature``: 1 up to ``above_c``, then
    ``per_c`` more per degree above it."""
    return 1.0 + per_c * max(0.0, temperature - above_c)


def relax(temperature: float, toward: float, elapsed: float, tau_s: float) -> float:
    """The temperature ``elapsed`` seconds on, heading for ``toward`` with time constant ``tau_s``."""
    return toward + (temperature - toward) * math.exp(-max(0.0, elapsed) / tau_s)


class Thermal:
    """One board's temperature (°C). ``clock`` is ``time.monotonic`` unless a test gives its own."""

    def __init__(self, ambient_c: float = DEFAULT_AMBIENT_C, tau_s: float = DEFAULT_TAU_S,
                 clock: Callable[[], float] = time.monotonic,
                 work_heat_c_per_s: float = DEFAULT_WORK_HEAT_C_PER_S):
        if tau_s <= 0:
            raise ValueError(f"tau must be positive, not {tau_s!r}")
        self.ambient_c, self.tau_s, self.clock = ambient_c, tau_s, clock
        self.work_heat_c_per_s = work_heat_c_per_s
        self._lock = threading.Lock()  # the console's thread heats it, the exporter's threads read it
        self._temperature = ambient_c
        self._at = clock()
        self._stress_until = self._at
        self._work_until = self._at

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

    def work(self, seconds: float) -> None:
        """The board works for ``seconds`` from now (``run-workload``), taking in
        ``work_heat_c_per_s`` degrees a second while it does."""
        with self._lock:
            self._advance()
            self._work_until = max(self._work_until, self._at + seconds)

    def rest(self) -> None:
        """The work ends now (a workload interrupted)."""
        with self._lock:
            self._advance()
            self._work_until = min(self._work_until, self._at)

    def working(self) -> bool:
        with self._lock:
            return self.clock() < self._work_until

    def _advance(self) -> float:
        """Bring the held value up to now (the lock held), piece by piece: heading for the
        stress's target while stressed, taking in the work's heat while working, else cooling."""
        now = self.clock()
        while now > self._at:
            ends = [t for t in (self._stress_until, self._work_until) if t > self._at]
            until = min([now, *ends])
            if self._stress_until > self._at:
                toward, tau = self.ambient_c + STRESS_RISE_C, STRESS_TAU_S
            elif self._work_until > self._at:
                toward, tau = self.ambient_c + self.work_heat_c_per_s * self.tau_s, self.tau_s
            else:
                toward, tau = self.ambient_c, self.tau_s
            self._temperature = relax(self._temperature, toward, until - self._at, tau)
            self._at = until
        return self._temperature
