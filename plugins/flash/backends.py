"""The ways to write an image, and which one a config entry asks for."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from device_loop.plugin import Duration, OperationError, PluginConfig, last_lines

from .file_target import write_and_verify

BACKENDS = ("target", "fastboot", "command")
DEFAULT_TIMEOUT_S = {"fastboot": 600.0, "command": 1800.0}
FIELDS = ("image", "sha256", "size", "device", "name")


class FlashConfig(PluginConfig):
    """A flash target's entry: exactly one of ``BACKENDS``, and what goes with it."""

    target: str | None = Field(default=None, description="a block device or a file")
    fastboot: str | None = Field(default=None, description="a phone's serial number, flashed with fastboot")
    partition: str = Field(default="boot", min_length=1, description="the partition fastboot writes")
    command: str | None = Field(default=None, description="a command template, run without a shell")
    timeout: Duration | None = Field(default=None, description="how long fastboot or the command may run")

    @field_validator("command")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        try:
            [arg.format(**{f: "" for f in FIELDS}) for arg in shlex.split(value or "")]
        except (ValueError, KeyError, IndexError) as exc:
            raise ValueError(f"command {value!r} is not a usable template ({exc}); fields: "
                             f"{', '.join('{' + f + '}' for f in FIELDS)}") from None
        return value

    @model_validator(mode="after")
    def _one_backend(self):
        chosen = self.exactly_one(*BACKENDS)
        if not getattr(self, chosen).strip():
            raise ValueError(f"{chosen} must not be blank")
        if "partition" in self.model_fields_set and chosen != "fastboot":
            raise ValueError("partition goes with fastboot")
        if self.timeout is not None and chosen not in DEFAULT_TIMEOUT_S:
            raise ValueError(f"timeout goes with {' or '.join(DEFAULT_TIMEOUT_S)}: a target is written by the "
                             "exporter itself")
        return self

    @property
    def backend(self) -> str:
        """Which of ``BACKENDS`` writes the image."""
        return next(name for name in BACKENDS if getattr(self, name) is not None)

    @property
    def argv(self) -> list[str]:
        """The command template, split as a shell would (it is run without one)."""
        return shlex.split(self.command or "")

    @property
    def timeout_s(self) -> float:
        """How long the program (fastboot or the command) may run."""
        return self.timeout or DEFAULT_TIMEOUT_S[self.backend]


def flash_with(host, resource, image, progress) -> dict[str, Any]:
    """Write ``image`` with the backend the resource's config chose: the result, its
    ``message`` and whether what was written was read back (``verified``: only a target can
    be; fastboot and a command cannot)."""
    config = resource.config
    backend = config.backend
    if backend == "target":
        return write_and_verify(Path(config.target), image, progress)
    if backend == "fastboot":
        argv = ["fastboot", "-s", config.fastboot, "flash", config.partition, str(image.path)]
        what = f"fastboot {config.partition} of {config.fastboot}"
    else:
        fields = {"image": str(image.path), "sha256": image.sha256, "size": image.size, "device": resource.device,
                  "name": image.name}
        argv = [arg.format(**fields) for arg in config.argv]
        what = argv[0]
    progress("writing", 0)
    try:
        code, output = host.run_to_end(argv, name=f"flash-{resource.device}", timeout=config.timeout_s)
    except OSError as exc:
        raise OperationError(f"cannot run {argv[0]}: {exc.strerror}", changed=False) from None
    last = last_lines(output)
    if code is None:
        hint = f" (is {config.fastboot} plugged in and in fastboot mode?)" if backend == "fastboot" else ""
        raise OperationError(f"{what} did not finish within {config.timeout_s:g}s{hint}; killed it"
                         + (f"; it said: {last}" if last else ""))
    if code != 0:
        raise OperationError(f"{what} failed (exit code {code})" + (f": {last}" if last else ""))
    progress("writing", image.size)
    return {"message": f"written by {what}; not read back (it cannot be)", "verified": False}
