"""Finding and running the programs of the backends that switch through one."""
from __future__ import annotations

import os
import shutil

from device_loop.plugin import OperationError

# uhubctl and ipmitool live in /usr/sbin on Debian, which a service's PATH may lack
EXTRA_PATH = ("/usr/local/sbin", "/usr/sbin", "/sbin")


def find_program(name: str) -> str | None:
    """The path of program ``name`` (on ``PATH``, or in an sbin folder), else None."""
    if os.sep in name:
        return name if os.access(name, os.X_OK) else None
    path = os.pathsep.join([os.environ.get("PATH", os.defpath), *EXTRA_PATH])
    return shutil.which(name, path=path)


def run_program(host, resource, argv: list[str], timeout: float) -> tuple[int, str]:
    """Run ``argv`` to its end within ``timeout`` seconds (what is left of the call's):
    ``(exit code, output)``. A program that cannot start, or that overstays (it is killed,
    with all it forked), raises ``OperationError``."""
    program = find_program(argv[0])
    if program is None:
        raise OperationError(f"{argv[0]} is not installed here (not on PATH)", changed=False)
    try:
        code, output = host.run_to_end([program, *argv[1:]], name=f"power-{resource.device}", timeout=timeout)
    except OSError as exc:
        raise OperationError(f"cannot run {argv[0]}: {exc.strerror or exc}", changed=False) from None
    if code is None:
        raise OperationError(f"{argv[0]} did not finish within {resource.config.timeout:g}s; killed it"
                             + (f"; it said: {last_lines(output)}" if output.strip() else ""))
    return code, output


def last_lines(output: str, count: int = 3) -> str:
    """The last ``count`` non-blank lines of ``output``, on one line."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    return " / ".join(lines[-count:])[-500:]
