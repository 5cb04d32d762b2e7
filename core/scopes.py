"""What a scoped token may do (docs/architecture.md, "Shares of one lab"): the one model an
admin's ``token create --scope`` and ``token set`` fill, the tokens table keeps (as JSON)
and the coordinator checks every call against.

A field left ``None`` does not limit. Bounds here are the model's; what needs the lab to
judge (a class it has, an operation some device runs) the coordinator checks on creation.
"""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from . import FLASH_KIND, POWER_KIND, SETTLE_KIND
from .durations import format_duration, parse_duration
from .vocabulary import BudgetPeriod, PowerAction

MAX_SCOPE_NAMES = 64              # classes, tags or operations a scope lists
MAX_SCOPE_LEASES = 1000
MAX_SCOPE_LEASE_S = 7 * 86400     # the longest "longest lease": a week
MAX_BUDGET_S = 366 * 86400 * 100  # a hundred devices all year: more is no budget

#: The operations a scope names that are calls rather than kinds of operation a plugin runs
#: (those are named by their kind, as ``device_info`` lists them): each call of the calls
#: table that acts on a device names one of these, or a power action as ``power.ACTION``.
CALL_OPERATIONS = ("exec", "uart", "camera", "fingerprint", FLASH_KIND, "recover", SETTLE_KIND, "job", "image")
POWER_OPERATION = POWER_KIND + ".{action}"

#: The power actions a scope names (``power.cycle``): ``power`` alone names none of them.
POWER_OPERATIONS = tuple(POWER_OPERATION.format(action=action.value) for action in PowerAction)

#: The data plane: what a scope names for a lease's endpoints of each resource kind, and their
#: gates' secret (``core/gate.py``, ``gate_secret``). A console is a shell: a scope that lists
#: operations and not these gives none of a lease's endpoints. ``uart`` and ``camera`` also
#: name the coordinator's relayed exchange and snapshot (the same console, the same camera); a
#: plugin's resource kind names its own endpoints.
DATA_PLANE = {"uart": "uart", "adb": "adb", "video": "camera", "vnc": "screen", "ssh": "ssh"}
DATA_PLANE_OPERATIONS = tuple(dict.fromkeys(DATA_PLANE.values()))


def data_plane_operation(kind: str) -> str:
    """The scope operation that gives a lease's endpoints of resource ``kind``."""
    return DATA_PLANE.get(kind, kind)

_Name = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:=-]*$")
#: A class, tag or operation a scope lists (each one bounded, as the lists are).
ScopeName = Annotated[str, _Name]


class TokenScope(BaseModel):
    """What a scoped token may do; ``None`` in a field: no limit there."""
    model_config = ConfigDict(frozen=True, extra="forbid")

    classes: tuple[ScopeName, ...] | None = Field(default=None, max_length=MAX_SCOPE_NAMES,
                                            description="the device classes it may reserve")
    tags: tuple[ScopeName, ...] | None = Field(default=None, max_length=MAX_SCOPE_NAMES,
                                         description="it may reserve only devices with at least one of these tags")
    operations: tuple[ScopeName, ...] | None = Field(default=None, max_length=MAX_SCOPE_NAMES,
                                               description="the operations it may run: exec, uart, camera, "
                                                           "fingerprint, flash, recover, settle, job, image, "
                                                           "power.on/off/cycle/status, or a plugin's kind; and "
                                                           "the endpoints it is shown: uart, adb, camera, screen, "
                                                           "ssh, or a plugin's resource kind")
    max_leases: int | None = Field(default=None, ge=1, le=MAX_SCOPE_LEASES, description="the most leases at once")
    max_lease_s: float | None = Field(default=None, ge=60, le=MAX_SCOPE_LEASE_S,
                                      description="the longest a lease may last, from its grant")
    budget_s: float | None = Field(default=None, ge=0, le=MAX_BUDGET_S,
                                   description="device-seconds it may hold leases for, each period")
    budget_period: BudgetPeriod = Field(default=BudgetPeriod.DAY, description="day (UTC) or token (its life)")


def allows(scope: TokenScope | None, operation: str) -> bool:
    """Whether ``scope`` lets its token run ``operation`` (None: an unscoped token may)."""
    return scope is None or scope.operations is None or operation in scope.operations


# ---- the command line's words for a scope (``admin token create/set --scope KEY=VALUE``) -------

#: ``--scope KEY=...`` -> the field it fills: a list (comma-separated; several options add up),
#: or one number (``leases=3``) or duration (``lease=2h``).
SCOPE_KEYS = {"class": "classes", "tag": "tags", "op": "operations", "leases": "max_leases", "lease": "max_lease_s"}
LISTS = ("classes", "tags", "operations")
#: What ``--no-limit`` lifts: a key of ``SCOPE_KEYS``, or the budget.
LIMIT_FIELDS = {**SCOPE_KEYS, "budget": "budget_s"}


def parse_scope(options: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The fields of a ``TokenScope`` that ``--scope`` options name, e.g. ``["class=rpi4,jetson",
    "op=exec,power.cycle", "leases=2", "lease=2h"]``; ``op=`` (nothing after it) allows none.
    Raises ValueError saying which option is wrong (the model bounds the values)."""
    fields: dict[str, Any] = {}
    for option in options:
        key, equals, value = option.partition("=")
        field = SCOPE_KEYS.get(key.strip())
        if not equals or field is None:
            raise ValueError(f"{option[:80]!r}: use KEY=VALUE, KEY one of {', '.join(SCOPE_KEYS)} "
                             "(e.g. class=rpi4, op=exec,power.cycle, leases=2, lease=2h)")
        value = value.strip()
        if field in LISTS:
            fields[field] = (*fields.get(field, ()), *(name.strip() for name in value.split(",") if name.strip()))
        elif field == "max_leases":
            if not value.isdigit():
                raise ValueError(f"{option[:80]!r}: leases= takes a whole number (the most leases at once)")
            fields[field] = int(value)
        else:
            fields[field] = parse_duration(value)
            if fields[field] > MAX_SCOPE_LEASE_S:
                raise ValueError(f"{option[:80]!r}: a scope's longest lease is at most "
                                 f"{format_duration(MAX_SCOPE_LEASE_S)} (and the lab's own longest)")
    return fields


def parse_budget(text: str) -> dict[str, Any]:
    """The budget fields of ``--budget``: device-time per period, ``120m/day`` or ``10h/token``
    (``/day`` if no period is said). Raises ValueError saying what is wrong."""
    amount, _, period = text.strip().partition("/")
    try:
        seconds = parse_duration(amount)
        return {"budget_s": seconds, "budget_period": BudgetPeriod(period.strip() or BudgetPeriod.DAY)}
    except ValueError as exc:
        raise ValueError(f"{text[:80]!r}: a budget is device-time per day or per token, e.g. 120m/day or "
                         f"10h/token ({exc})") from None


def describe_scope(scope: TokenScope | None) -> str:
    """A scope as ``token ls`` shows it, in the words ``--scope`` takes (without its budget)."""
    if scope is None:
        return "-"
    words = [f"{key}={','.join(getattr(scope, field))}" for key, field in SCOPE_KEYS.items()
             if field in LISTS and getattr(scope, field) is not None]
    if scope.max_leases is not None:
        words.append(f"leases={scope.max_leases}")
    if scope.max_lease_s is not None:
        words.append(f"lease={format_duration(scope.max_lease_s)}")
    return " ".join(words) or "(no limit)"


def describe_budget(scope: TokenScope | None) -> str:
    """A scope's budget as ``--budget`` takes it (``120m/day``), or ``-``."""
    if scope is None or scope.budget_s is None:
        return "-"
    return f"{format_duration(scope.budget_s)}/{scope.budget_period.value}"
