"""The ways to write an image, and which one a config entry asks for."""
from __future__ import annotations

import shlex
from pathlib import Path

from device_loop.plugin import FlashError, parse_duration

from .file_target import write_and_verify

BACKENDS = ("target", "fastboot", "command")
DEFAULT_TIMEOUT_S = {"fastboot": 600.0, "command": 1800.0}
FIELDS = ("image", "sha256", "size", "device", "name")
KEYS = (*BACKENDS, "partition", "timeout")


def backend_of(settings: dict) -> tuple[str, dict]:
    """(the backend, its settings with defaults); ValueError says what is wrong."""
    chosen = [name for name in BACKENDS if name in settings]
    if len(chosen) != 1:
        raise ValueError(f"give exactly one of {', '.join(BACKENDS)} (found: {', '.join(chosen) or 'none'})")
    backend = chosen[0]
    value = settings[backend]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{backend} must be a non-empty string, not {value!r}")
    out = {backend: value}
    if backend == "fastboot":
        out["partition"] = settings.get("partition", "boot")
    if backend == "command":
        try:
            argv = shlex.split(value)
            [arg.format(**{f: "" for f in FIELDS}) for arg in argv]
        except (ValueError, KeyError, IndexError) as exc:
            raise ValueError(f"command {value!r} is not a usable template ({exc}); fields: "
                             f"{', '.join('{' + f + '}' for f in FIELDS)}") from None
        out["argv"] = argv
    if backend in DEFAULT_TIMEOUT_S:
        timeout = settings.get("timeout", DEFAULT_TIMEOUT_S[backend])
        try:
            if isinstance(timeout, bool):
                raise ValueError(timeout)
            out["timeout"] = parse_duration(timeout)
        except (ValueError, TypeError):
            raise ValueError(f"timeout must be a positive number of seconds (or 90s, 10m, 1h), not {timeout!r}") \
                from None
    return backend, out


def flash_with(host, resource, image, progress) -> str:
    backend, settings = backend_of(resource.config)
    if backend == "target":
        return write_and_verify(Path(settings["target"]), image, progress)
    if backend == "fastboot":
        argv = ["fastboot", "-s", settings["fastboot"], "flash", settings["partition"], str(image.path)]
        what = f"fastboot {settings['partition']} of {settings['fastboot']}"
    else:
        fields = {"image": str(image.path), "sha256": image.sha256, "size": image.size, "device": resource.device,
                  "name": image.name}
        argv = [arg.format(**fields) for arg in settings["argv"]]
        what = argv[0]
    progress("writing", 0)
    try:
        code, output = host.run_to_end(argv, name=f"flash-{resource.device}", timeout=settings["timeout"])
    except OSError as exc:
        raise FlashError(f"cannot run {argv[0]}: {exc.strerror}", changed=False) from None
    last = " / ".join(line.strip() for line in output.strip().splitlines()[-3:] if line.strip())
    if code is None:
        hint = f" (is {settings['fastboot']} plugged in and in fastboot mode?)" if backend == "fastboot" else ""
        raise FlashError(f"{what} did not finish within {settings['timeout']:g}s{hint}; killed it"
                         + (f"; it said: {last}" if last else ""))
    if code != 0:
        raise FlashError(f"{what} failed (exit code {code})" + (f": {last}" if last else ""))
    progress("writing", image.size)
    return f"written by {what}; not read back (it cannot be)"
