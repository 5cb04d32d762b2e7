"""Every rule of the lab, as services that each hold only what they use, handed their
collaborators when they are made (``Rules``). The routes and MCP tools call them, and
nothing else; SQL lives in ``store/``, one query object per service's tables, which this
wiring hands to the services that own those tables and to those lent them, and to nobody
else (docs/architecture.md, "A service reaches only its tables"). Each method that writes
runs in one transaction and wakes the long-polls once it committed.

- ``lifecycle`` (``Lifecycle``): what every service writes with — a device's state from its
  facts and its ring log, the audit log, the clock, the long-polls' notifier;
- ``devices`` (``Devices``): what the lab looks like (devices, logs, hosts, audit);
- ``budgets`` (``Budgets``): scoped tokens' budgets held and settled, and their leases at once;
- ``leases`` (``Leases``): reserve, renew, release, expiry; what a holder sees;
- ``images`` (``Images``): the registry and its files;
- ``operations`` (``Operations``): operations on devices, flash and recovery among them;
- ``scheduler`` (``Scheduler``): reserve by name or by class and tags, queue tickets, grants;
- ``steps`` (``Steps``): the steps a device runs between two leases, and ``settle``;
- ``power`` (``Power``): what power operations leave in a device's log, and the automatic power cycle;
- ``hosts`` (``Hosts``): heartbeats and the desired state;
- ``admin`` (``Admin``): retire, drain, adopt, forget, tokens;
- ``jobs`` (``Jobs``): jobs, their cells and runs, and the leases they hold.
"""
from __future__ import annotations

import time
from typing import Callable

from device_loop.core.vocabulary import DeviceState

from .admin import Admin
from .budgets import Budgets
from .devices import Devices
from .hosts import Hosts
from .image_files import ImageFiles
from .images import Images
from .jobs import Jobs
from .leases import Leases
from .lifecycle import Lifecycle, Settings
from .metrics import LabMetrics
from .operations import Operations
from .power import Power
from .scheduler import Scheduler
from .steps import Steps
from .store import Store
from .store.audit import AuditQueries
from .store.budgets import BudgetQueries
from .store.devices import DeviceQueries
from .store.hosts import HostQueries
from .store.idempotency import IdempotencyQueries
from .store.images import ImageQueries
from .store.jobs import JobQueries
from .store.leases import LeaseQueries
from .store.metrics import MetricQueries
from .store.operations import OperationQueries
from .store.tickets import TicketQueries
from .store.tokens import TokenQueries
from .who import COORDINATOR

__all__ = ["Rules", "Settings"]

IDEMPOTENCY_KEPT_S = 86400.0
PRUNE_EVERY_S = 60.0    # how often the reaper prunes old operations and audit entries ...
PRUNE_BATCH = 1000      # ... this many rows a transaction (the writer is not held for long) ...
PRUNE_BATCHES = 10      # ... at most this many transactions a pass: the rest at the next


class Rules:
    """The services of one coordinator process, wired together."""

    def __init__(self, store: Store, settings: Settings | None = None, clock: Callable[[], float] = time.time):
        devices_sql, hosts_sql, leases_sql = DeviceQueries(store), HostQueries(store), LeaseQueries(store)
        operations_sql, images_sql, tickets_sql = OperationQueries(store), ImageQueries(store), TicketQueries(store)
        audit_sql, self.idempotency_sql = AuditQueries(store), IdempotencyQueries(store)
        self.life = Lifecycle(store, LabMetrics(tuple(DeviceState), MetricQueries(store)), settings, clock,
                              devices_sql=devices_sql, audit_sql=audit_sql)
        self.devices = Devices(self.life, devices_sql=devices_sql, hosts_sql=hosts_sql, operations_sql=operations_sql,
                               audit_sql=audit_sql)
        self.budgets = Budgets(self.life, budgets_sql=BudgetQueries(store))
        self.leases = Leases(self.life, self.devices, self.budgets, leases_sql=leases_sql, devices_sql=devices_sql)
        self.images = Images(self.life, ImageFiles(self.life.settings.image_dir), images_sql=images_sql,
                             devices_sql=devices_sql, operations_sql=operations_sql)
        self.operations = Operations(self.life, self.leases, self.images, operations_sql=operations_sql,
                                     devices_sql=devices_sql, leases_sql=leases_sql, images_sql=images_sql)
        self.scheduler = Scheduler(self.life, self.leases, self.images, tickets_sql=tickets_sql, leases_sql=leases_sql,
                                   devices_sql=devices_sql)
        self.steps = Steps(self.life, self.leases, self.operations, devices_sql=devices_sql,
                           operations_sql=operations_sql)
        self.power = Power(self.life, self.operations, devices_sql=devices_sql)
        self.hosts = Hosts(self.life, self.leases, self.operations, self.steps, self.scheduler, self.power,
                           hosts_sql=hosts_sql, devices_sql=devices_sql, leases_sql=leases_sql,
                           operations_sql=operations_sql)
        self.admin = Admin(self.life, self.devices, self.leases, self.scheduler, hosts_sql=hosts_sql,
                           devices_sql=devices_sql, leases_sql=leases_sql, operations_sql=operations_sql,
                           tokens_sql=TokenQueries(store))
        self.jobs = Jobs(self.life, self.scheduler, self.leases, jobs_sql=JobQueries(store), leases_sql=leases_sql,
                         tickets_sql=tickets_sql, devices_sql=devices_sql)
        self._lapses = (leases_sql, tickets_sql)  # (forgiven when the lab is back: ``back``)
        self._next_prune = 0.0
        self.reap_passes = 0  # the reaper's passes that ended, failed or not (app.py): tests wait for the first

    # what tests and tools reach for: the lifecycle's own
    @property
    def store(self) -> Store:
        return self.life.store

    @property
    def settings(self) -> Settings:
        return self.life.settings

    @property
    def clock(self) -> Callable[[], float]:
        return self.life.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.life.clock = clock

    @property
    def serving_since(self) -> float:
        return self.life.serving_since

    @serving_since.setter
    def serving_since(self, at: float) -> None:
        self.life.serving_since = at

    async def back(self) -> None:
        """The lab serves again after a time its clients could not reach it: this process
        began serving, or its database is back (docs/architecture.md, "A lab that was away").
        Silence counts from now (hosts' heartbeats, workers' beats), and every keepalive lease
        and ticket lapses a keepalive from now at the earliest: the lab's own absence is held
        against no client that kept asking meanwhile."""
        now = self.life.clock()
        self.life.serving_since = max(self.life.serving_since, now)
        leases_sql, tickets_sql = self._lapses
        async with self.life.store.tx():
            await leases_sql.forgive_lapses(now)
            await tickets_sql.forgive_lapses(now)

    async def reap(self) -> None:
        """Expire leases (a keepalive lease's client that stopped renewing among them), fail
        allocations that took too long, mark silent hosts offline, take back grants nobody
        claimed, end the grants whose lease ended unclaimed, expire the keepalive tickets nobody
        asks about any more, grant free devices to tickets a grant did not see, forget old
        idempotency keys, fail the jobs whose worker was lost; sweep the registry's files, prune
        old operations and audit entries (as the lab keeps them) when that is due."""
        async with self.life.store.tx():
            now = self.life.clock()
            await self.leases.end_overdue(now, COORDINATOR)
            await self.hosts.mark_silent(now, COORDINATOR)
            await self.scheduler.expire_unclaimed(now, COORDINATOR)
            await self.scheduler.expire_lapsed(now, COORDINATOR)
            await self.scheduler.end_past_their_lease(now)  # (after both: a grant they end says why)
            await self.idempotency_sql.drop_idempotency_keys_before(now - IDEMPOTENCY_KEPT_S)
        await self.scheduler.grant_wanted()
        await self.jobs.end_silent(self.life.clock(), COORDINATOR)
        await self.images.sweep_files_if_due()
        now = self.life.clock()
        if now >= self._next_prune:
            self._next_prune = now + PRUNE_EVERY_S
            await self.operations.prune(now, PRUNE_BATCH, PRUNE_BATCHES)
            await self.life.prune_audit(now, PRUNE_BATCH, PRUNE_BATCHES)
            await self.budgets.prune(now)
