"""Finding and running the programs of the backends that switch through one."""
from __future__ import annotations

from device_loop.plugin import OperationError, find_program, last_lines


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
