"""Who is calling, as the services see it: one typed caller (``Who``) and the questions the
rules ask of it (docs/architecture.md, "Access", "Who may act on what").

``identity.py`` finds out who calls (a token, the tailnet, the trust mode of ``device-loop
up``); every service is handed the ``Who`` it made, never a loose ``admin`` flag.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from device_loop.core.scopes import TokenScope
from device_loop.core.vocabulary import Band


class CallerKind(StrEnum):
    """What kind of caller a ``Who`` is."""
    PERSON = "person"                # a person's token, or a tailnet login
    AGENT = "agent"                  # a token an admin made for an agent: its queue tickets are batch
    EXPORTER = "exporter"            # an exporter's token, bound to one host
    TRUSTED_LOCAL = "trusted_local"  # the single-user trust mode of `device-loop up`, on loopback
    ANONYMOUS = "anonymous"          # no credentials at all
    LAB = "lab"                      # the coordinator's own actions (``lab_actor``)


@dataclass(frozen=True)
class Who:
    """One caller: its name, its kind, whether its token is an admin's, and for the web page's
    cookie sign-in what its unsafe requests must carry."""
    name: str
    kind: CallerKind = CallerKind.PERSON
    admin: bool = False               # an admin's token (or a tailnet login listed as an admin)
    host: str | None = None           # exporter tokens only: the host they report for
    csrf: str | None = None           # signed in by the page's cookie: what its unsafe requests carry
    csrf_missing: bool = False        # ... and this unsafe request does not: only public routes answer it
    token_id: str | None = None       # the token it called with (its budget's and its usage's key)
    scope: TokenScope | None = None   # what a scoped token may do (None: unscoped; docs/architecture.md,
    #                                   "Shares of one lab")
    band: Band = Band.NORMAL          # its tickets' priority band, as an admin set it on its token

    @property
    def known(self) -> bool:
        """Whether the caller showed any credentials."""
        return self.kind is not CallerKind.ANONYMOUS

    @property
    def trusted(self) -> bool:
        """The trust mode's caller: it may call every route, admin ones included."""
        return self.kind is CallerKind.TRUSTED_LOCAL

    @property
    def agent(self) -> bool:
        """An agent's token: its queue tickets are batch."""
        return self.kind is CallerKind.AGENT

    @property
    def may_see_all(self) -> bool:
        """Whether the board and the lists show this caller everything: lease ids on devices,
        holders' command lines, exporters' file paths, ticket ids on the queue, everyone's
        tickets and jobs. Admins and the trust mode's caller (the lab's owner) do."""
        return self.admin or self.trusted

    def may_act_on(self, *owners: str | None) -> bool:
        """Whether this caller may read or act on a thing one of ``owners`` owns (a lease's
        holder, a ticket's requester, a job's owner or worker, an image's uploader): its
        owner, or an admin's token. The trust mode's caller is a person here: another name's
        lease it takes back through the admin routes, as an admin says so
        (docs/architecture.md, "Who may act on what")."""
        return self.admin or (self.known and self.name in owners)

    @property
    def limited(self) -> bool:
        """Whether the per-person limits (live leases, open tickets, open jobs) bind this
        caller: every caller but an admin's token (admins are counted, not limited)."""
        return not self.admin


ANONYMOUS = Who("anonymous", CallerKind.ANONYMOUS)

#: The name the coordinator's own actions go under in the audit log and the ring logs (the
#: reaper, the steps between leases, an automatic power cycle): nobody may be called so
#: (``identity.RESERVED_NAMES``), or they could pass for the lab itself.
COORDINATOR = "coordinator"


def lab_actor(name: str) -> Who:
    """The lab's own action under ``name`` (a job that ends cancels its tickets; ``name`` as
    the audit log says who ended it) as a caller: it acts on anyone's."""
    return Who(name, CallerKind.LAB, admin=True)
