"""What a scoped token may do (docs/architecture.md, "Shares of one lab"): the one model an
admin's ``token create --scope`` and ``token set`` fill, the tokens table keeps (as JSON)
and the coordinator checks every call against.

A field left ``None`` does not limit. Bounds here are the model's; what needs the lab to
judge (a class it has, an operation some device runs) the coordinator checks on creation.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from . import FLASH_KIND, POWER_KIND, SETTLE_KIND
from .vocabulary import BudgetPeriod

MAX_SCOPE_NAMES = 64              # classes, tags or operations a scope lists
MAX_SCOPE_LEASES = 1000
MAX_SCOPE_LEASE_S = 7 * 86400     # the longest "longest lease": a week
MAX_BUDGET_S = 366 * 86400 * 100  # a hundred devices all year: more is no budget

#: The operations a scope names that are calls rather than kinds of operation a plugin runs
#: (those are named by their kind, as ``device_info`` lists them): each call of the calls
#: table that acts on a device names one of these, or a power action as ``power.ACTION``.
CALL_OPERATIONS = ("exec", "uart", "camera", "fingerprint", FLASH_KIND, "recover", SETTLE_KIND, "job", "image")
POWER_OPERATION = POWER_KIND + ".{action}"

_Name = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:=-]*$")


class TokenScope(BaseModel):
    """What a scoped token may do; ``None`` in a field: no limit there."""
    model_config = ConfigDict(frozen=True, extra="forbid")

    classes: tuple[str, ...] | None = Field(default=None, max_length=MAX_SCOPE_NAMES,
                                            description="the device classes it may reserve")
    tags: tuple[str, ...] | None = Field(default=None, max_length=MAX_SCOPE_NAMES,
                                         description="it may reserve only devices with at least one of these tags")
    operations: tuple[str, ...] | None = Field(default=None, max_length=MAX_SCOPE_NAMES,
                                               description="the operations it may run: exec, uart, camera, "
                                                           "fingerprint, flash, recover, settle, job, image, "
                                                           "power.on/off/cycle/status, or a plugin's kind")
    max_leases: int | None = Field(default=None, ge=1, le=MAX_SCOPE_LEASES, description="the most leases at once")
    max_lease_s: float | None = Field(default=None, ge=60, le=MAX_SCOPE_LEASE_S,
                                      description="the longest a lease may last, from its grant")
    budget_s: float | None = Field(default=None, ge=0, le=MAX_BUDGET_S,
                                   description="device-seconds it may hold leases for, each period")
    budget_period: BudgetPeriod = Field(default=BudgetPeriod.DAY, description="day (UTC) or token (its life)")
