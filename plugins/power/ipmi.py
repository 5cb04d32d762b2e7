"""Switching a machine through its BMC with ipmitool (IPMI over LAN), read back with
``chassis power status``. The password stays in its file: ipmitool reads it (``-f``)."""
from __future__ import annotations

import re
import time
from typing import ClassVar, Literal

from pydantic import Field

from device_loop.plugin import OperationError, PowerReading, last_lines

from .keys import BackendKeys
from .programs import run_program


READ_BACK_S = 5.0  # how long a BMC may take to report the state it was just told
POLL_S = 0.2
STATE = re.compile(r"Chassis Power is (on|off)", re.IGNORECASE)


def password_problem(path: str) -> str | None:
    """Why the password file cannot be used, or None."""
    try:
        with open(path, "rb") as file:
            if not file.read(1):
                return f"the BMC's password file {path} is empty"
    except FileNotFoundError:
        return f"the BMC's password file {path} does not exist"
    except OSError as exc:
        return f"cannot read the BMC's password file {path}: {exc.strerror or exc}"
    return None


def argv_for(config, *command: str) -> list[str]:
    """ipmitool's argv for ``command`` on the BMC (no secret: the password is a file)."""
    argv = ["ipmitool", "-v", "-I", config.interface]
    if config.interface == "lanplus":
        argv += ["-C", str(config.cipher_suite)]
    return argv + ["-H", config.host, "-p", str(config.port), "-U", config.user, "-f", config.password_file,
                   *command]


def _ipmitool(host, resource, deadline: float, *command: str) -> str:
    config = resource.config.settings
    bmc = f"the BMC at {config.host}:{config.port}"
    code, output = run_program(host, resource, argv_for(config, *command), max(1.0, deadline - time.monotonic()))
    if code == 0:
        return output
    said = next((line.strip() for line in output.splitlines() if line.startswith("Error: Unable to establish")),
                last_lines(output))
    lowered = output.lower()
    if "hmac is invalid" in lowered or "activate session command failed" in lowered:
        reason = f"{bmc} refused user {config.user}'s password"
    elif "unauthorized name" in lowered:
        reason = f"{bmc} has no user {config.user}"
    elif "get auth capabilities error" in lowered or "authentication capabilities" in lowered:
        reason = f"no BMC answers at {config.host}:{config.port}"
    elif "unable to read password" in lowered or "unable to open password file" in lowered:
        reason = f"ipmitool cannot read the password file {config.password_file}"
    elif "unable to establish" in lowered:
        reason = f"cannot open a session with {bmc}"
    else:
        raise OperationError(f"ipmitool chassis {' '.join(command[1:])} failed on {bmc} (exit code {code}): "
                             f"{last_lines(output)}", changed=command[-1] != "status")
    raise OperationError(f"{reason} (ipmitool: {said})", changed=False)


def _state(output: str) -> str | None:
    match = STATE.search(output)
    return match.group(1).lower() if match else None


def power(host, resource, action: str) -> PowerReading:
    """Switch (or read) the chassis power, then read it back until it says so (a few seconds)."""
    config = resource.config.settings
    problem = password_problem(config.password_file)
    if problem:
        raise OperationError(problem, changed=False)
    deadline = time.monotonic() + config.timeout
    bmc = f"the BMC at {config.host}:{config.port}"
    if action != "status":
        _ipmitool(host, resource, deadline, "chassis", "power", action)
    read_back_until = min(deadline, time.monotonic() + READ_BACK_S)
    try:
        while True:
            state = _state(_ipmitool(host, resource, deadline, "chassis", "power", "status"))
            if action == "status" or state == action or time.monotonic() >= read_back_until:
                break
            time.sleep(POLL_S)
    except OperationError as exc:
        if action == "status":
            raise
        raise OperationError(f"{bmc} was told power {action}, but reading it back failed: {exc}") from None
    if action == "status":
        return PowerReading(state, f"{bmc} reads chassis power {state or 'unknown'}")
    if state != action:
        raise OperationError(f"{bmc} was told power {action}, but it still reads {state or 'no state'} "
                             f"after {READ_BACK_S:g}s")
    return PowerReading(state, f"{bmc} switched chassis power {action}; reads {state}")


class Keys(BackendKeys):
    """A BMC, with ipmitool."""
    OFF_TIME: ClassVar[float] = 5.0
    PROGRAMS: ClassVar[tuple[str, ...]] = ("ipmitool",)
    backend: Literal["ipmi"]
    host: str = Field(min_length=1, description="the BMC's address")
    port: int = Field(default=623, ge=1, le=65535, description="the BMC's port")
    user: str = Field(min_length=1, description="the BMC's user")
    password_file: str = Field(min_length=1, description="a file holding the BMC's password")
    interface: Literal["lanplus", "lan"] = Field(default="lanplus", description="ipmitool's interface")
    cipher_suite: int = Field(default=3, ge=0, le=17, description="ipmitool's cipher suite (lanplus)")
