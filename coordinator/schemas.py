"""What callers pass, one model a call (``calls.py``): the REST route takes the fields as path
parameters (those its path names), query parameters (a GET) or the JSON body (a POST), each
under its alias where it has one; the MCP tool takes them as arguments under their field
names, with these descriptions, which is all an agent reads. Unknown fields are refused
(422), and in a JSON body so is a value of another JSON type (``api.py`` parses strictly).
Exporters speak ``device_loop.core.protocol``."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from device_loop.core import NAME_PATTERN
from device_loop.core.protocol import Args, Strict, Word, check_device_name
from device_loop.core.vocabulary import DeviceState

MAX_WAIT_S = 60.0  # a long-poll's wait, at most (an MCP tool waits less: mcp_tools.py)
REF = Field(min_length=1, max_length=128, description="the image's ref (sha256: and 8 to 64 of its digits, as "
                                                     "list_images gives it) or its name")


# a lease's or an operation's long-poll
WAIT_S = Field(default=0, alias="wait", ge=0, le=MAX_WAIT_S,
               description="long-poll: answer once its state differs from `unless`, or after this many seconds")
UNLESS = Field(default=None, max_length=32, description="the state it had (default, for a wait: the one it has now)")


class NoArgs(Strict):
    pass


# ---- the board ---------------------------------------------------------------------------

class DeviceFilter(Strict):
    state: DeviceState | None = Field(default=None, description="only devices in this state")
    tags: str | None = Field(default=None, max_length=1000, description="only devices with all these tags, "
                                                                       "separated by commas")

    @field_validator("state", mode="before")
    @classmethod
    def _a_state(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in DeviceState.__members__.values():
            raise ValueError(f"no device state is called {value[:64]!r}; the states are "
                             f"{', '.join(DeviceState)}")
        return value


class DeviceName(Strict):
    device: str = Field(alias="name", min_length=1, max_length=64, description="the device's name")


class DeviceOperations(DeviceName):
    kind: Word | None = Field(default=None, description="only operations of this kind (flash, ...)")


# ---- the exporter protocol -----------------------------------------------------------------

class HostName(Strict):
    host: str = Field(alias="name", min_length=1, max_length=64, description="the host's name")


class DesiredWait(HostName):
    etag: str | None = Field(default=None, max_length=64, description="the desired state's etag it has")
    boot: str | None = Field(default=None, max_length=64, description="its exporter's boot id")
    wait_s: float = Field(default=0, alias="wait", ge=0, le=MAX_WAIT_S,
                          description="long-poll: answer once the etag differs, or after this many seconds")


# ---- leases ----------------------------------------------------------------------------------

# A ttl's range is the rules' to check, with the lab's own --max-ttl in the message.
class ReserveIn(Strict):
    device: str = Field(min_length=1, max_length=64, description="the device's name")
    ttl_s: float | None = Field(default=None, description="the lease's length in seconds (default: the lab's)")


class MyLeases(Strict):
    device: str | None = Field(default=None, max_length=64,
                               description="only the lease on this device (live, else the last that ended)")


class LeaseId(Strict):
    lease_id: str = Field(min_length=1, max_length=64, description="the lease's id (lease-...)")


class LeaseWait(LeaseId):
    wait_s: float = WAIT_S
    unless: str | None = UNLESS


class RenewIn(LeaseId):
    ttl_s: float = Field(description="the lease then expires this many seconds from now")


class OperationIn(LeaseId):
    kind: Word = Field(description="the operation's kind, as the device's resources offer them (device_info: "
                                   "resources[].operations)")
    args: Args = Field(default_factory=dict, description="its arguments, as its kind describes them")


class FlashIn(LeaseId):
    image: str = REF


class OpWait(Strict):
    op_id: str = Field(min_length=1, max_length=64, description="the operation's id (op-...)")
    wait_s: float = WAIT_S
    unless: str | None = UNLESS


# ---- what agents ask the coordinator to relay (one bounded exchange) -----------------------

class UartExchangeIn(LeaseId):
    send: str = Field(max_length=64 * 1024, description="the text to send once (include the line ending, e.g. "
                                                        "'\\r')")
    wait_s: float = Field(default=2.0, ge=0, le=10, description="how long to collect what it prints (10 s at most)")

    @field_validator("send", mode="before")
    @classmethod
    def _at_most_64_kib(cls, value: Any) -> Any:
        if isinstance(value, str) and len(value) > 64 * 1024:
            raise ValueError("send at most 64 KiB at once")
        return value


# ---- images ----------------------------------------------------------------------------------

class UploadQuery(Strict):
    """An upload's body is the image; what it is comes in the query string."""
    name: str = Field(max_length=64, description="the image's name")
    target: str = Field(alias="for", max_length=71, description="the device or class it is for")
    description: str = Field(default="", max_length=1000)
    sha256: str | None = Field(default=None, max_length=64, description="its sha256, if the uploader knows it")
    size: int | None = Field(default=None, ge=0, description="its size in bytes, if the uploader knows it")


class ImageFilter(Strict):
    device: str | None = Field(default=None, max_length=64, description="only images for this device and its class")


class ImageRefIn(Strict):
    ref: str = REF


class KnownGoodIn(ImageRefIn):
    target: str = Field(alias="for", min_length=1, max_length=71, description="the device or class: NAME, "
                                                                             "device:NAME or class:NAME")


class CollectIn(Strict):
    unused_days: float = Field(default=30, ge=0, le=100 * 365, description="remove images nothing used this long")


class ImageOfHost(HostName):
    sha256: str = Field(min_length=1, max_length=64, description="the image's sha256")


# ---- admin ---------------------------------------------------------------------------------------

class TokenIn(Strict):
    user: str | None = Field(default=None, max_length=64)
    admin: bool = False
    exporter_host: str | None = Field(default=None, max_length=64)
    expires_s: float | None = Field(default=None, ge=60, le=10 * 365 * 86400)


class TokenId(Strict):
    token_id: str = Field(min_length=1, max_length=64)


class AdminDevice(Strict):
    device: str = Field(min_length=1, max_length=64, description="the device's name")


class RetireIn(AdminDevice):
    retired: bool = True
    force: bool = False


class DrainIn(Strict):
    host: str = Field(min_length=1, max_length=64)
    draining: bool = True


class ForgetIn(Strict):
    name: str = Field(pattern=NAME_PATTERN, description="the device's or the host's name")
    kind: Literal["device", "host"] | None = Field(default=None, description="which one, if a device and a host "
                                                                             "share the name")


class AdoptIn(Strict):
    identifier: str = Field(min_length=1, max_length=255, description="the candidate's identifier")
    name: str = Field(pattern=NAME_PATTERN)
    device_class: str = Field(default="generic", alias="class", min_length=1, max_length=64)
    tags: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("name")
    @classmethod
    def _not_a_lease_id(cls, name: str) -> str:
        return check_device_name(name)


def split_tags(tags: str | None) -> list[str]:
    return [t.strip() for t in (tags or "").split(",") if t.strip()]


def aliases(model: type[Strict]) -> dict[str, str]:
    """Field name -> the name REST calls it by."""
    return {name: field.alias or name for name, field in model.model_fields.items()}


def as_args(model: type[Strict], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` under REST's names (``aliases``)."""
    names = aliases(model)
    return {names.get(k, k): v for k, v in values.items()}
