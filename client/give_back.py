"""Giving back what a wait for a device held when the wait is cut short (Ctrl-C, a CI
runner's cancel): the queue ticket, with a grant not yet claimed, else the lease it made or
claimed. Written once for ``device-loop reserve --wait`` and ``device-loop with``
(docs/architecture.md, "A lease bound to a command": nothing is left reserved that nobody
knows of)."""
from __future__ import annotations

from dataclasses import dataclass

from device_loop.core.errors import ErrorCode
from device_loop.core.vocabulary import TicketState

from .http import Coordinator, CoordinatorError
from .lab import Lease, Ticket


@dataclass(frozen=True)
class GivenBack:
    """What was done, in words, and the lease that was released (one claimed while the ticket
    was being cancelled included), if any."""
    said: str
    lease: Lease | None = None


def give_back(api: Coordinator, ticket: Ticket | None, lease: Lease | None) -> GivenBack:
    """Cancel ``ticket`` (its grant, not yet claimed, goes back with it), else release
    ``lease``: a ticket claimed meanwhile has its lease released. Never raises a refusal: a
    give-back that failed is said."""
    api.close()  # (an interrupted request's answer may be half read: a new connection)
    if ticket is None and lease is None:
        return GivenBack("nothing was reserved")
    try:
        if ticket is not None and lease is None:
            try:
                ended = ticket.cancel().data
            except CoordinatorError as exc:
                if exc.code != ErrorCode.TICKET_ENDED:
                    raise
                ended = ticket.refresh().data  # claimed meanwhile: its lease is released below
                if ended["state"] != TicketState.CLAIMED or not ended["lease"]:
                    return GivenBack(f"{ticket.id} is {ended['state']}")
                lease = Lease(api, ended["lease"])
            else:
                granted = ended["lease"]
                return GivenBack(f"{ticket.id} cancelled: " + (f"its grant, {granted['id']} on {granted['device']}, "
                                                               "is given back" if granted else "nothing waits for you"))
        assert lease is not None
        gone = lease.release().data
        said = f"{gone['id']} on {gone['device']} released" + (f" (its ticket {ticket.id})" if ticket else "")
        return GivenBack(said, lease)
    except CoordinatorError as exc:
        what = lease.id if lease is not None else ticket.id if ticket is not None else "it"
        return GivenBack(f"could not give {what} back: {exc.message}", lease)
