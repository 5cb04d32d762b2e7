"""What every backend's keys have in common (docs/architecture.md, "Power"): each backend
declares its own keys as a model of this (``Keys`` in its module), and the power config is
the union of those models on ``backend``."""
from __future__ import annotations

from typing import ClassVar, get_args

from pydantic import BaseModel, ConfigDict, Field

from device_loop.plugin import Duration

#: What a command's arguments may name: ``{device}``.
TEMPLATE_FIELDS = ("device",)


class BackendKeys(BaseModel):
    """The keys every backend takes; a backend's model adds its own (unknown keys refused)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    OFF_TIME: ClassVar[float] = 2.0  # a cycle's default off-time with this backend
    PROGRAMS: ClassVar[tuple[str, ...]] = ()  # what it runs, checked by the switch's health
    backend: str
    off_time: Duration = Field(default=2.0, ge=0, description="a cycle's default off-time (seconds)")
    timeout: Duration = Field(default=30.0, gt=0, description="how long one call of the switch may take")
    console_timeout: Duration = Field(default=20.0, gt=0,
                                      description="how long after power-on the console may stay silent")

    @classmethod
    def name(cls) -> str:
        """The backend's name: the one its ``backend`` takes (``Literal["sim"]``)."""
        return get_args(cls.model_fields["backend"].annotation)[0]

    def programs(self, device: str) -> list[str]:
        """The programs this switch runs (its health checks that they are installed)."""
        return list(self.PROGRAMS)
