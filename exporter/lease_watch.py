"""Whose a device's failures are (docs/architecture.md, "Health that heals"): which devices a
lease holds, as the services this exporter runs for leases say, and when the steps between
leases that follow a lease are over, as the operations it reports say: each of the device's
steps has ended since its lease let go of it, or one failed (a device without steps: at once).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from device_loop.core.protocol import OperationReport, ServiceReport
from device_loop.core.vocabulary import OperationState


@dataclass
class _AfterLease:
    """A device a lease let go of, while its steps run."""
    before: set[str]  # the operations it had then (its holder's, which are no steps)
    ended: dict[str, bool] = field(default_factory=dict)  # a step's operation that ended since -> it failed


class LeaseWatch:
    """The devices leases hold, and those whose steps after a lease run, from one report to the next."""

    def __init__(self) -> None:
        self.leased: set[str] = set()
        self._after: dict[str, _AfterLease] = {}

    def follow(self, services: Sequence[ServiceReport], operations: Sequence[OperationReport],
               steps_of: Callable[[str], list[str]]) -> tuple[set[str], set[str]]:
        """What the next report says: (the devices a lease holds now, the devices whose steps
        after a lease are over now). ``steps_of``: a device's steps, as the kinds of the
        operations they are asked for as."""
        leased = {service.device for service in services}
        for device in self.leased - leased:
            self._after[device] = _AfterLease({op.op for op in operations if op.device == device})
        for device in leased:
            self._after.pop(device, None)
        self.leased = leased
        done = set()
        for device, after in list(self._after.items()):
            kinds = steps_of(device)
            for op in operations:
                if op.device == device and op.state != OperationState.RUNNING and op.kind in kinds \
                        and op.op not in after.before:
                    after.ended[op.op] = op.state == OperationState.FAILED
            if len(after.ended) >= len(kinds) or any(after.ended.values()):
                done.add(device)
                del self._after[device]
        return leased, done
