"""What clients may send (exporters speak ``device_loop.core.protocol``). Unknown fields
are refused (422), and so is a value of another JSON type (api.py parses strictly)."""
from typing import Literal

from pydantic import Field, field_validator

from device_loop.core import NAME_PATTERN
from device_loop.core.protocol import Strict, check_device_name


# A ttl's range is the rules' to check, with the lab's own --max-ttl in the message.
class ReserveIn(Strict):
    device: str = Field(min_length=1, max_length=64)
    ttl_s: float | None = None


class RenewIn(Strict):
    ttl_s: float


class TokenIn(Strict):
    user: str | None = Field(default=None, max_length=64)
    admin: bool = False
    exporter_host: str | None = Field(default=None, max_length=64)
    expires_s: float | None = Field(default=None, ge=60, le=10 * 365 * 86400)


class RetireIn(Strict):
    retired: bool = True
    force: bool = False


class DrainIn(Strict):
    draining: bool = True


class ForgetIn(Strict):
    name: str = Field(pattern=NAME_PATTERN, description="the device's or the host's name")
    kind: Literal["device", "host"] | None = Field(default=None, description="which one, if a device and a host "
                                                                             "share the name")


class AdoptIn(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    device_class: str = Field(default="generic", alias="class", min_length=1, max_length=64)
    tags: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("name")
    @classmethod
    def _not_a_lease_id(cls, name: str) -> str:
        return check_device_name(name)


class KnownGoodIn(Strict):
    target: str = Field(alias="for", min_length=1, max_length=64)


class CollectIn(Strict):
    unused_days: float = Field(default=30, ge=0, le=100 * 365)


class FlashIn(Strict):
    image: str = Field(min_length=1, max_length=71,
                       description="the image's ref (sha256: and 8 to 64 of its digits) or its name")
