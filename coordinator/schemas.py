"""What callers pass, one model a call (``calls.py``): the REST route takes the fields as path
parameters (those its path names), query parameters (a GET) or the JSON body (a POST), each
under its alias where it has one; the MCP tool takes them as arguments under their field
names, with these descriptions, which is all an agent reads. Unknown fields are refused
(422), and in a JSON body so is a value of another JSON type (``api.py`` parses strictly).
Exporters speak ``device_loop.core.protocol``."""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from device_loop.core import NAME_PATTERN
from device_loop.core.durations import KEEPALIVE_RANGE_S, keepalive_problem
from device_loop.core.needs import DEFAULT_FALLBACK_AFTER_S, MAX_FALLBACK_AFTER_S, Need, check
from device_loop.core.protocol import MAX_TAG_CHARS, MAX_TAGS, Args, Strict, Tag, Word, check_device_name
from device_loop.core.scopes import TokenScope
from device_loop.core.vocabulary import Band, DeviceState, Needs, PowerAction, TokenKind

MAX_WAIT_S = 60.0  # a long-poll's wait, at most (an MCP tool waits less: mcp_tools.py)
UNTIL_MAX_CHARS = 500  # uart_exchange's regular expression
REF = Field(min_length=1, max_length=128,
            description="the image: its ref, 'sha256:' and 8 to 64 hexadecimal digits of its digest as list_images "
                        "gives it (e.g. 'sha256:3f9a0c2b7d1e'), or its name (e.g. 'rootfs-v2'); 1 to 128 characters")


# a lease's or an operation's long-poll
WAIT_S = Field(default=0, alias="wait", ge=0, le=MAX_WAIT_S,
               description="long-poll, in seconds: answer as soon as its state differs from `unless`, else after "
                           "this long (0 to 60; an MCP tool waits 30 at most; default 0: answer at once; e.g. 20)")
UNLESS = Field(default=None, max_length=32,
               description="with wait_s: the state the caller last saw, e.g. 'pending' (a lease) or 'running' (an "
                           "operation); the answer comes once the state is another (at most 32 characters; "
                           "default: the state it has now)")


class NoArgs(Strict):
    pass


# ---- the board ---------------------------------------------------------------------------

class DeviceFilter(Strict):
    device_class: str | None = Field(default=None, alias="class", max_length=64,
                                     description="only devices of this class (e.g. riscv-sbc); default: any class")
    state: DeviceState | None = Field(default=None, description="only devices in this state (e.g. 'idle': free to "
                                                                 "reserve); default: devices in any state")
    tags: str | None = Field(default=None, max_length=1000,
                             description="only devices with all of these tags, separated by commas (at most 1000 "
                                         "characters, e.g. 'sim,riscv'); default: whatever their tags")

    @field_validator("state", mode="before")
    @classmethod
    def _a_state(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in DeviceState.__members__.values():
            raise ValueError(f"no device state is called {value[:64]!r}; the states are "
                             f"{', '.join(DeviceState)}")
        return value


class DeviceName(Strict):
    device: str = Field(alias="name", min_length=1, max_length=64,
                        description="the device's name, as list_devices shows it (1 to 64 characters, e.g. "
                                    "'sim-board-0')")


class DeviceOperations(DeviceName):
    kind: Word | None = Field(default=None, description="only operations of this kind (a lowercase word of 1 to 32 "
                                                        "letters, digits and '-', e.g. 'flash'); default: every kind")


# ---- the exporter protocol -----------------------------------------------------------------

class HostName(Strict):
    host: str = Field(alias="name", min_length=1, max_length=64, description="the host's name")


class DesiredWait(HostName):
    etag: str | None = Field(default=None, max_length=64, description="the desired state's etag it has")
    boot: str | None = Field(default=None, max_length=64, description="its exporter's boot id")
    wait_s: float = Field(default=0, alias="wait", ge=0, le=MAX_WAIT_S,
                          description="long-poll: answer once the etag differs, or after this many seconds")


# ---- leases ----------------------------------------------------------------------------------

class NeedsIn(Strict):
    """What a request may run on (docs/architecture.md, "Who gets the next lease"), declared
    once for every call that takes it (``core/needs.py`` reads it)."""
    needs: Needs | None = Field(default=None, description="what it may run on: 'real-hw' (a board, or a simulated "
                                                          "one) or 'any' (a virtual machine or an emulator first); "
                                                          "default: any device, whatever it is")
    fallback: Needs | None = Field(default=None, description="with needs 'any': 'real-hw', a real device once it "
                                                             "waited fallback_after_s for a virtual one (a queued "
                                                             "ticket's wait); default: none")
    fallback_after_s: float | None = Field(
        default=None, ge=0, le=MAX_FALLBACK_AFTER_S,
        description=f"with fallback: seconds to wait for a virtual device first (0 to {MAX_FALLBACK_AFTER_S:g}, "
                    f"default {DEFAULT_FALLBACK_AFTER_S:g}, e.g. 120)")

    @model_validator(mode="after")
    def _fallback_with_needs_any(self):
        check(self.needs, self.fallback, self.fallback_after_s)
        return self

    @property
    def need(self) -> Need:
        return Need(self.needs, self.fallback, self.fallback_after_s)


# A ttl's range is the rules' to check, with the lab's own --max-ttl in the message.
class ReserveIn(NeedsIn):
    device: str | None = Field(default=None, min_length=1, max_length=64,
                               description="the device's name, e.g. sim-board-0 (or give device_class and/or tags "
                                           "instead: any free device that matches)")
    device_class: str | None = Field(default=None, alias="class", min_length=1, max_length=64,
                                     description="any free device of this class, e.g. riscv-sbc (list_devices shows "
                                                 "each device's class); the one idle the longest is taken")
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS,
                            description="any free device with every one of these tags, e.g. [\"rvv\", \"8gb\"] "
                                        f"(at most {MAX_TAGS})")
    queue: bool = Field(default=False, description="when nothing that matches is free, answer with a queue ticket "
                                                   "(never waits: follow it with claim_ticket) instead of a refusal")
    ttl_s: float | None = Field(default=None, description="the lease's length in seconds, from when it is granted "
                                                          "(at least 1, at most the lab's maximum; default the lab's "
                                                          "default, e.g. 1800; with keepalive_s, the lab's maximum)")
    keepalive_s: float | None = Field(
        default=None, json_schema_extra={"minimum": KEEPALIVE_RANGE_S[0], "maximum": KEEPALIVE_RANGE_S[1]},
        description=f"a keepalive lease: it ends (expired) unless renewed without ttl_s at least every this many "
                    f"seconds ({KEEPALIVE_RANGE_S[0]:g} to {KEEPALIVE_RANGE_S[1]:g}, e.g. 30; renew every third of "
                    "it), so a client that dies frees the device within it; with queue, the ticket likewise lapses "
                    "unless followed (claim_ticket) this often. Default: none, the lease lasts its ttl")
    image: str | None = Field(default=None, min_length=1, max_length=128,
                              description="by class, tags or needs: prefer a free device whose last flash wrote this "
                                          "registry image and read it back (its ref 'sha256:...' or its name, 1 to "
                                          "128 characters, e.g. 'rootfs-v2'); never waits for one. Refused (404) if "
                                          "no such image. Default: no preference")

    @field_validator("keepalive_s")
    @classmethod
    def _keepalive_in_range(cls, keepalive_s: float | None) -> float | None:
        if keepalive_s is not None and (problem := keepalive_problem(keepalive_s)):
            raise ValueError(problem)
        return keepalive_s


class MyLeases(Strict):
    device: str | None = Field(default=None, max_length=64,
                               description="only the lease on this device (live, else the last that ended)")


class LeaseId(Strict):
    lease_id: str = Field(min_length=1, max_length=64,
                          description="the lease's id, as reserve answered it ('lease-' and 16 hexadecimal digits, "
                                      "e.g. 'lease-3f9a0c2b7d1e4a56'; at most 64 characters)")


class LeaseWait(LeaseId):
    wait_s: float = WAIT_S
    unless: str | None = UNLESS


class RenewIn(LeaseId):
    ttl_s: float | None = Field(default=None,
                                description="the lease then ends this many seconds from now (1 s to the lab's maximum "
                                            "lease length, e.g. 3600); without it, a keep-alive of a keepalive lease: "
                                            "it expires keepalive_s from now, never past its end (ends_at)")


class OperationIn(LeaseId):
    kind: Word = Field(description="the operation's kind: one the device's resources run, as device_info lists "
                                   "them under resources[].operations (a lowercase word of 1 to 32 characters, e.g. "
                                   "'flash')")
    args: Args = Field(default_factory=dict,
                       description="its arguments by name, as device_info describes them for its kind: at most 32, "
                                   "each a text of at most 4096 characters, a number, true, false or null (e.g. "
                                   "{\"image\": \"sha256:3f9a0c2b\"}); default: none")


class FlashIn(LeaseId):
    image: str = REF


_POWER_ACTION = Field(description="what to do with the device's power: 'on', 'off', 'cycle' (off for off_time_s, then "
                                  "on) or 'status' (read the switch)")
_OFF_TIME = Field(default=None, ge=0, le=600,
                  description="a cycle's seconds with the power off, from 0 to 600 (e.g. 5); default: the switch's "
                              "own (2 s for USB and most PDUs, 5 s for pdudaemon and BMCs)")


class PowerSwitch(Strict):
    """What a power operation is asked to do (docs/architecture.md, "Power")."""
    action: PowerAction = _POWER_ACTION
    off_time_s: float | None = _OFF_TIME

    @model_validator(mode="after")
    def _off_time_with_a_cycle(self):
        if self.off_time_s is not None and self.action != PowerAction.CYCLE:
            raise ValueError("off_time_s goes with action 'cycle'")
        return self


class PowerIn(PowerSwitch, LeaseId):
    pass


class OpWait(Strict):
    op_id: str = Field(min_length=1, max_length=64,
                       description="the operation's id, as start_operation, flash or recover answered it ('op-' and "
                                   "16 hexadecimal digits, e.g. 'op-9b1c2d3e4f5a6b7c'; at most 64 characters)")
    wait_s: float = WAIT_S
    unless: str | None = UNLESS


# ---- what agents ask the coordinator to relay (one bounded exchange) -----------------------

class UartExchangeIn(LeaseId):
    send: str = Field(max_length=64 * 1024,
                      description="the text to send once, as UTF-8 (at most 64 KiB): include the line ending the "
                                  "board expects, e.g. 'uname\\r'; '' sends nothing and only listens")
    wait_s: float = Field(default=2.0, ge=0, le=10,
                          description="how many seconds to collect what the board prints (0 to 10, default 2, e.g. "
                                      "5); with until, the longest it waits for a match")
    until: str | None = Field(default=None, min_length=1, max_length=UNTIL_MAX_CHARS,
                              description=f"a Python regular expression (1 to {UNTIL_MAX_CHARS} characters, e.g. "
                                          "'# $' for a shell prompt, 'login: $'): answer as soon as what the board "
                                          "printed since the send (its echo included, as UTF-8) matches, instead of "
                                          "after wait_s; the answer's matched says whether it did. Default: none, "
                                          "collect for wait_s")

    @field_validator("send", mode="before")
    @classmethod
    def _at_most_64_kib(cls, value: Any) -> Any:
        if isinstance(value, str) and len(value) > 64 * 1024:
            raise ValueError("send at most 64 KiB at once")
        return value

    @field_validator("until")
    @classmethod
    def _a_regular_expression(cls, until: str | None) -> str | None:
        if until is not None:
            try:
                re.compile(until)
            except (re.error, RecursionError, OverflowError) as exc:
                raise ValueError(f"until is not a regular expression Python reads ({exc}); e.g. '# $' matches a "
                                 "prompt at the end of the output") from None
        return until


# ---- images ----------------------------------------------------------------------------------

class UploadQuery(Strict):
    """An upload's body is the image; what it is comes in the query string."""
    name: str = Field(max_length=64, description="the image's name")
    target: str = Field(alias="for", min_length=1, max_length=71, description="the device or class it is for")
    description: str = Field(default="", max_length=1000)
    sha256: str | None = Field(default=None, max_length=64, description="its sha256, if the uploader knows it")
    size: int | None = Field(default=None, ge=0, description="its size in bytes, if the uploader knows it")


class ImageFilter(Strict):
    device: str | None = Field(default=None, max_length=64,
                               description="only images for this device and its class (a device's name, at most 64 "
                                           "characters, e.g. 'sim-board-0'); default: every image")


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

_SCOPE = ("what the token may do (docs/architecture.md, 'Shares of one lab'): classes, tags, operations, "
          "max_leases, max_lease_s, budget_s and budget_period; a field left out or null does not limit")
_BAND = "its queue tickets' priority band: urgent, normal or background"


class TokenIn(Strict):
    user: str | None = Field(default=None, max_length=64)
    admin: bool = False
    kind: TokenKind = Field(default=TokenKind.PERSON, description="person, or agent (its queue tickets are batch)")
    exporter_host: str | None = Field(default=None, max_length=64)
    expires_s: float | None = Field(default=None, ge=60, le=10 * 365 * 86400)
    scope: TokenScope | None = Field(default=None, description=f"{_SCOPE} (default: unscoped)")
    band: Band = Field(default=Band.NORMAL, description=f"{_BAND} (default: normal)")


class TokenId(Strict):
    token_id: str = Field(min_length=1, max_length=64)


class TokenSetIn(TokenId):
    """An admin's change of a token's scope or band, in place: the token's next call is held to it."""
    scope: TokenScope | None = Field(default=None, description=f"{_SCOPE}: the fields given replace the "
                                                               "token's (a null one lifts that limit); the "
                                                               "others stay")
    band: Band | None = Field(default=None, description=f"{_BAND} (default: as it is)")
    unscoped: bool = Field(default=False, description="take its scope away (not with scope)")


class AdminDevice(Strict):
    device: str = Field(min_length=1, max_length=64, description="the device's name")


class MarkFaultyIn(AdminDevice):
    """An admin's mark of a device as faulty, and why."""
    reason: str = Field(min_length=1, max_length=300, description="why, for the people who read its page")


class AdminPowerIn(PowerSwitch, AdminDevice):
    pass


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
    # what the exporter reports back of the adopted device: the protocol's tags, or every heartbeat is refused
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS,
                            description=f"the device's tags: at most {MAX_TAGS}, each of 1 to {MAX_TAG_CHARS} "
                                        "characters")

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


# ---- queue tickets, settle, faults (docs/architecture.md, "Who gets the next lease", "Steps between leases")

class TicketId(Strict):
    ticket_id: str = Field(min_length=1, max_length=64, description="the ticket's id, as reserve with queue "
                                                                    "answered it (tk-...)")


class TicketWait(TicketId):
    wait_s: float = Field(default=0, alias="wait", ge=0, le=MAX_WAIT_S,
                          description="long-poll: answer at the ticket's first change (granted, expired, "
                                      "cancelled), or after this many seconds (an MCP call waits 30 s at most), "
                                      "e.g. 25")


class ClaimTicketIn(TicketId):
    wait_s: float = Field(default=0, ge=0, le=MAX_WAIT_S,
                          description="long-poll, in seconds: answer at the ticket's first change (granted and "
                                      "then claimed, expired, cancelled), or after this long (0 to 60; an MCP call "
                                      "waits 30 s at most), e.g. 25")


class TicketFilter(Strict):
    everyone: bool = Field(default=False, alias="all", description="an admin's: every person's tickets, not "
                                                                   "only the caller's")


