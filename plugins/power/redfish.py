"""Switching a machine through a Redfish service (a BMC's, sushy-emulator's): the system's
``ComputerSystem.Reset`` action, read back by polling its ``PowerState``."""
from __future__ import annotations

import base64
import json
import re
import ssl
import time
import urllib.parse
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from device_loop.plugin import OperationError, PowerReading

from . import web
from .keys import BackendKeys


SYSTEMS = "/redfish/v1/Systems"
POLL_S = 0.25
SETTLING_S = 5.0  # how long a status waits for a PoweringOn/PoweringOff to end
STATES = {"On": "on", "Off": "off"}
RESET = "#ComputerSystem.Reset"
BODY_LIMIT = 1 << 20  # a Redfish answer past 1 MiB is not read
DEFAULT_PORTS = {"http": 80, "https": 443}
REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5


class Service:
    """One Redfish service, as an entry configures it, for the length of one call."""

    def __init__(self, config, deadline: float):
        self.config = config
        self.deadline = deadline
        self.headers = {"Accept": "application/json"}
        if config.user is not None:
            self.headers["Authorization"] = "Basic " + base64.b64encode(
                f"{config.user}:{_password(config.password_file)}".encode()).decode()
        self.context = None
        if config.url.startswith("https:") and not config.verify_tls:
            self.context = ssl.create_default_context()
            self.context.check_hostname = False
            self.context.verify_mode = ssl.CERT_NONE

    def url_of(self, ref) -> str:
        """The URL of ``ref``, a path the service named (``@odata.id``, an action's
        ``target``) or an absolute URL of the configured service itself (its scheme, host and
        port). Any other is refused, before anything is sent to it: the request would take
        the credentials elsewhere."""
        base = urllib.parse.urlsplit(self.config.url)
        origin = f"{base.scheme}://{base.netloc}"
        if isinstance(ref, str) and ref and not any(c.isspace() or ord(c) < 32 or c == "\\" for c in ref):
            parts = urllib.parse.urlsplit(ref)
            if not parts.scheme and not parts.netloc and ref.startswith("/"):
                return origin + ref
            try:
                same = (parts.scheme.lower() == base.scheme.lower() and parts.username is None
                        and parts.password is None and (parts.hostname or "") == (base.hostname or "")
                        and _port(parts) == _port(base))
            except ValueError:  # a port that is not one
                same = False
            if same:
                return origin + urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        raise OperationError(f"refused to follow {ref!r}: not a path of the Redfish service at {self.config.url} "
                             "(a request there would take its credentials elsewhere); nothing was sent to it",
                             changed=False)

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """``(HTTP status, JSON body or {})`` of ``method path``, answered before the call's
        deadline; 404 is returned, other failures raise ``OperationError``. A redirect is
        followed (a GET's, and a POST's that keeps its method: 307, 308) when it names this
        service (``url_of``), at most ``MAX_REDIRECTS`` times."""
        data = None if body is None else json.dumps(body).encode()
        headers = {**self.headers, **({"Content-Type": "application/json"} if data is not None else {})}
        acting = method != "GET"
        url = self.url_of(path)
        for _ in range(MAX_REDIRECTS + 1):
            try:
                answer = web.request(url, deadline=self.deadline, limit=BODY_LIMIT, method=method, body=data,
                                     headers=headers, context=self.context)
            except web.Late as exc:
                raise OperationError(f"the Redfish service at {self.config.url} did not answer {method} {path} "
                                     f"within {self.config.timeout:g}s", changed=acting and exc.sent) from None
            except web.Broken as exc:
                reason = exc.reason
                text = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
                raise OperationError(f"cannot reach the Redfish service at {self.config.url}: {text}",
                                     changed=acting and exc.sent) from None
            location = answer.headers.get("Location")
            if not (answer.status in REDIRECTS and location and (not acting or answer.status in (307, 308))):
                break
            url = self.url_of(urllib.parse.urljoin(url, location))
        else:
            raise OperationError(f"the Redfish service at {self.config.url} redirected {method} {path} more than "
                                 f"{MAX_REDIRECTS} times", changed=False)
        if answer.truncated:
            raise OperationError(f"the Redfish service at {self.config.url} answered {method} {path} with more "
                                 f"than {BODY_LIMIT >> 20} MiB; not read", changed=acting)
        code = answer.status
        if code == 404:
            return 404, {}
        if code in (401, 403):
            who = (f"the credentials of user {self.config.user}" if self.config.user is not None else
                   "to answer without credentials (give user and password_file)")
            raise OperationError(f"the Redfish service at {self.config.url} refused {who} "
                                 f"(HTTP {code} on {method} {path})", changed=False)
        if code >= 300:
            said = _message(_json(answer.body))
            if 300 <= code < 400:
                said = f"a redirect to {answer.headers.get('Location')!r}, not followed"  # a POST's 301-303
            raise OperationError(f"the Redfish service at {self.config.url} answered HTTP {code} to "
                                 f"{method} {path}" + (f": {said}" if said else ""),
                                 changed=acting and code >= 500)
        return code, _json(answer.body)

    def system(self) -> tuple[str, dict]:
        """The configured system's path and resource: by its path, its id, else by the Id or
        Name of a member of the Systems collection."""
        wanted = self.config.system
        path = wanted if wanted.startswith("/") else f"{SYSTEMS}/{wanted.strip('/')}"
        code, body = self.request("GET", path)
        if code != 404:
            return path, body
        if not wanted.startswith("/"):
            _, collection = self.request("GET", SYSTEMS)
            for member in collection.get("Members", []):
                member_path = member.get("@odata.id", "")
                if member_path:
                    _, system = self.request("GET", member_path)
                    if wanted in (system.get("Id"), system.get("Name")):
                        return member_path, system
        raise OperationError(f"the Redfish service at {self.config.url} has no system {wanted!r} "
                             f"(not {path}, nor an Id or Name under {SYSTEMS})", changed=False)


def _port(parts: urllib.parse.SplitResult) -> int | None:
    return parts.port if parts.port is not None else DEFAULT_PORTS.get(parts.scheme.lower())


def _password(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read().rstrip("\r\n")
    except FileNotFoundError:
        raise OperationError(f"the BMC's password file {path} does not exist", changed=False) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise OperationError(f"cannot read the BMC's password file {path}: "
                             f"{getattr(exc, 'strerror', None) or exc}", changed=False) from None


def _json(data: bytes) -> dict:
    try:
        value = json.loads(data) if data.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _message(body: dict) -> str:
    error = body.get("error", {}) if isinstance(body.get("error"), dict) else {}
    messages = [error.get("message", "")] + [info.get("Message", "") for info in
                                             error.get("@Message.ExtendedInfo", []) if isinstance(info, dict)]
    return " ".join(str(m) for m in messages if m)[:300]


def power(host, resource, action: str) -> PowerReading:
    """Switch (or read) the system's power: its Reset action with the configured type, then
    its ``PowerState`` polled until it says so, within the entry's ``timeout``."""
    config = resource.config.settings
    service = Service(config, time.monotonic() + config.timeout)
    path, system = service.system()
    name = system.get("Id") or path
    state = system.get("PowerState")
    if action == "status":
        settle_until = min(service.deadline, time.monotonic() + SETTLING_S)
        while state not in STATES and time.monotonic() < settle_until:
            time.sleep(POLL_S)
            state = service.request("GET", path)[1].get("PowerState")
        read = STATES.get(state) if isinstance(state, str) else None
        return PowerReading(read, f"system {name} reads PowerState {state or 'none'}")
    wanted = "On" if action == "on" else "Off"
    if state == wanted:
        return PowerReading(action, f"system {name} was {action} already (PowerState {state}); nothing done")
    reset_type = config.on_reset_type if action == "on" else config.off_reset_type
    actions = system.get("Actions")
    reset = actions.get(RESET) if isinstance(actions, dict) else None
    if not isinstance(reset, dict) or not reset.get("target"):
        raise OperationError(f"system {name} has no {RESET} action to switch it", changed=False)
    allowed = reset.get("ResetType@Redfish.AllowableValues")
    if isinstance(allowed, list) and reset_type not in allowed:
        raise OperationError(f"the BMC does not allow reset type {reset_type!r} on system {name}; it allows: "
                             f"{', '.join(map(str, allowed))}", changed=False)
    if service.request("POST", reset["target"], {"ResetType": reset_type})[0] == 404:
        raise OperationError(f"system {name}'s reset action {reset['target']} is not there (HTTP 404)",
                             changed=False)
    while True:
        try:
            state = service.request("GET", path)[1].get("PowerState")
        except OperationError as exc:
            raise OperationError(f"system {name} was reset with {reset_type}, but reading its PowerState back "
                                 f"failed: {exc}") from None
        if state == wanted:
            return PowerReading(action, f"system {name} reset with {reset_type}; PowerState reads {state}")
        if time.monotonic() + POLL_S >= service.deadline:
            raise OperationError(f"system {name} was reset with {reset_type}, but its PowerState still reads "
                                 f"{state or 'nothing'} after {config.timeout:g}s")
        time.sleep(POLL_S)


class Keys(BackendKeys):
    """A Redfish service's ComputerSystem."""
    OFF_TIME: ClassVar[float] = 5.0
    backend: Literal["redfish"]
    url: str = Field(description="the Redfish service's root, http(s)://HOST[:PORT]")
    system: str = Field(min_length=1,
                        description="the ComputerSystem: its id or name, or its path (/redfish/v1/Systems/ID)")
    user: str | None = Field(default=None, min_length=1, description="the BMC's user")
    password_file: str | None = Field(default=None, min_length=1, description="a file holding the BMC's password")
    on_reset_type: str = Field(default="On", min_length=1, description="the ResetType that switches on")
    off_reset_type: str = Field(default="ForceOff", min_length=1, description="the ResetType that switches off")
    verify_tls: bool = Field(default=True, description="check the BMC's TLS certificate")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        match = re.fullmatch(r"(https?)://([^/?#]+)/*", value)
        if not match:
            raise ValueError("the url is the Redfish service's root, http(s)://HOST[:PORT], not what was given")
        if "@" in match.group(2):
            # a password in a URL ends up in messages and logs
            raise ValueError("the url must not hold credentials: give 'user' and 'password_file'")
        return value.rstrip("/")

    @field_validator("system")
    @classmethod
    def _system(cls, value: str) -> str:
        if not value.strip("/").strip():
            raise ValueError("system must name a system")
        return value

    @model_validator(mode="after")
    def _basic_auth(self) -> "Keys":
        if (self.user is None) != (self.password_file is None):
            raise ValueError("'user' and 'password_file' go together (HTTP basic auth), or neither is given")
        return self
