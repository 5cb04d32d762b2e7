"""What the coordinator says and does of an operation kind beyond what every kind has
(docs/architecture.md, "Operations"), one entry a kind: the code a refusal carries while one
runs, what the device "is being", what to say of a device that has nothing to run it. A kind
that is not here is a plugin's: it has the words every operation has."""
from __future__ import annotations

from dataclasses import dataclass

from device_loop.core import FLASH_KIND
from device_loop.core.errors import ErrorCode


@dataclass(frozen=True)
class KindWords:
    """The words of one kind (``of``): a 409's ``busy_code``, ``doing`` in "is being ...", and
    ``missing``, the refusal (``missing_code``) when no resource of the device runs it
    (``{device}`` filled in)."""

    busy_code: ErrorCode = ErrorCode.OPERATION_RUNNING
    doing: str = ""
    missing: str | None = None
    missing_code: ErrorCode = ErrorCode.NO_SUCH_OPERATION


#: The kinds the coordinator mediates further, one entry each.
KINDS: dict[str, KindWords] = {
    FLASH_KIND: KindWords(busy_code=ErrorCode.FLASH_RUNNING, doing="flashed", missing_code=ErrorCode.NO_FLASH_TARGET,
                          missing=f"{{device}} has no flash target (a resource of kind {FLASH_KIND!r}, e.g. a "
                                  "[[devices.resources]] entry of a flash plugin in its exporter's config)"),
}


def of(kind: str | None) -> KindWords:
    """The words of ``kind`` (None: an operation of a kind not known here)."""
    if kind in KINDS:
        return KINDS[kind]
    return KindWords(doing=f"operated on ({kind})" if kind else "operated on")
