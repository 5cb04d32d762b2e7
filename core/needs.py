"""What a request may run on (docs/architecture.md, "Who gets the next lease"): a reserve's,
a ticket's or a job's ``needs`` read against a device's ``fidelity``, and what is not for
timing, in words. Plain Python: the coordinator's rules and SQL, the clients and the evidence
all take these, so each is decided once.

- no ``needs``: any device, as before needs existed;
- ``real-hw``: a board (``hardware``), or a model that stands in for one (``simulated``);
- ``any``: a virtual machine (``virtual``) or an emulator (``emulated``), and a real device
  too only when the request says ``fallback = "real-hw"``, once it waited ``fallback_after_s``.
"""
from __future__ import annotations

from dataclasses import dataclass

from .durations import format_duration
from .vocabulary import NOT_FOR_TIMING, Fidelity, Needs

#: What ``needs = "real-hw"`` takes: a board, or the model of one (the demo boards stand in for hardware).
REAL_HW = (Fidelity.HARDWARE, Fidelity.SIMULATED)
#: What ``needs = "any"`` takes first (its fallback adds ``REAL_HW`` after its wait).
VIRTUAL = (Fidelity.VIRTUAL, Fidelity.EMULATED)
#: How long a ticket with ``needs = "any"`` and ``fallback = "real-hw"`` waits for a virtual device.
DEFAULT_FALLBACK_AFTER_S = 60.0
#: The longest wait a request may name before its fallback (a day): anything longer is a mistake.
MAX_FALLBACK_AFTER_S = 86400.0
#: The fact a plugin adds to a device's fingerprint to say how it is emulated or virtualised
#: (``TCG``, ``KVM``): the evidence prints it beside the fidelity.
FIDELITY_DETAIL = "fidelity.detail"


def takes(needs: Needs | None) -> tuple[Fidelity, ...]:
    """The fidelities ``needs`` takes before any fallback (every one when None)."""
    if needs is None:
        return tuple(Fidelity)
    return REAL_HW if needs == Needs.REAL_HW else VIRTUAL


def check(needs: Needs | None, fallback: Needs | None, fallback_after_s: float | None) -> None:
    """Raise ``ValueError`` saying what is wrong with a request's needs, its fallback and its
    wait: a fallback goes with ``needs = "any"`` and is ``real-hw``; a wait goes with a fallback."""
    if fallback is not None and needs != Needs.ANY:
        raise ValueError(f"fallback goes with needs 'any' (a virtual device first, then a real one): needs is "
                         f"{needs.value if needs else 'not given'}")
    if fallback is not None and fallback != Needs.REAL_HW:
        raise ValueError("the only fallback is 'real-hw' (a real device after the wait)")
    if fallback_after_s is not None and fallback is None:
        raise ValueError("fallback_after goes with fallback 'real-hw': how long to wait for a virtual device first")
    if fallback_after_s is not None and not 0 <= fallback_after_s <= MAX_FALLBACK_AFTER_S:
        raise ValueError(f"fallback_after is 0 to {MAX_FALLBACK_AFTER_S:g} seconds (a day), not {fallback_after_s:g}")


@dataclass(frozen=True)
class Need:
    """What one request (a reserve, a ticket, a job's cells) may run on: its ``needs``, and
    with ``needs = "any"`` its ``fallback`` to real hardware after ``fallback_after_s``
    (None: ``DEFAULT_FALLBACK_AFTER_S``). Checked when made (``check``: ``ValueError``)."""
    needs: Needs | None = None
    fallback: Needs | None = None
    fallback_after_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("needs", "fallback"):  # (as the database reads them: plain text)
            value = getattr(self, name)
            if value is not None and not isinstance(value, Needs):
                object.__setattr__(self, name, Needs(value))
        check(self.needs, self.fallback, self.fallback_after_s)

    @property
    def wait_s(self) -> float | None:
        """How long it waits before its fallback applies (None: it has none)."""
        if self.fallback is None:
            return None
        return DEFAULT_FALLBACK_AFTER_S if self.fallback_after_s is None else self.fallback_after_s

    def fallback_at(self, since: float) -> float | None:
        """When its fallback applies, for a request made at ``since`` (None: never)."""
        wait = self.wait_s
        return None if wait is None else since + wait

    def fidelities(self, fallen_back: bool = False) -> tuple[Fidelity, ...] | None:
        """The fidelities it takes (None: every one, no needs), its fallback's too once ``fallen_back``."""
        if self.needs is None:
            return None
        return takes(self.needs) + (REAL_HW if fallen_back and self.fallback is not None else ())

    @property
    def falls_back_at_once(self) -> bool:
        """Its fallback applies without a wait (``fallback_after`` 0)."""
        return self.wait_s == 0

    def words(self) -> str:
        return describe(self.needs, self.fallback, self.wait_s)


#: A request without needs: any device, as before needs existed.
ANY_DEVICE = Need()


def meets(fidelity: str, needs: Needs | None, fallen_back: bool = False) -> bool:
    """Whether a device of ``fidelity`` is what ``needs`` takes (``fallen_back``: its
    fallback to real hardware applies now)."""
    return fidelity in takes(needs) or (fallen_back and fidelity in REAL_HW)


def describe(needs: Needs | None, fallback: Needs | None = None, fallback_after_s: float | None = None) -> str:
    """``needs any, real-hw after 1m`` (empty without needs): as the tickets, jobs and refusals say it."""
    if needs is None:
        return ""
    said = f"needs {needs.value}"
    if fallback is not None:
        after = DEFAULT_FALLBACK_AFTER_S if fallback_after_s is None else fallback_after_s
        said += f", {fallback.value} after {format_duration(after)}" if after else f", {fallback.value} at once"
    return said


def fidelity_text(fidelity: str | None, detail: str | None = None) -> str:
    """``emulated (TCG)``: a device's fidelity with how it is emulated, where its plugin said."""
    if not fidelity:
        return ""
    return f"{fidelity} ({detail})" if detail else str(fidelity)


def timing_note(fidelity: str | None, detail: str | None = None) -> str:
    """``emulated (TCG): not for timing`` for a device whose numbers are not for timing
    (``NOT_FOR_TIMING``), else empty."""
    if fidelity not in NOT_FOR_TIMING:
        return ""
    return f"{fidelity_text(fidelity, detail)}: not for timing"
