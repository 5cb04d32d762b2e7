"""Prometheus metrics (``GET /metrics``).

What the lab is (devices by state and class, live leases, each host's heartbeat age, what
each online host's plugins measure of themselves: ``device_loop_plugin_NAME{host, plugin}``)
is read from the database at scrape time: every coordinator process answers the same. What
happened (leases granted and ended, reserve -> ready latency, operations' outcomes) is counted
by each process since it started, after its transaction committed: scrape every process.
"""
from __future__ import annotations

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, disable_created_metrics,
                               generate_latest)
from prometheus_client.core import GaugeMetricFamily
from pydantic import ValidationError

from device_loop.core import LIVE_LEASE_STATES
from device_loop.core.protocol import PluginMetrics
from device_loop.core.vocabulary import BudgetPeriod

from .budgets import period_kind, period_of

from .store.metrics import MetricQueries

disable_created_metrics()  # no *_created series next to each counter: dashboards do not use them
READY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
WAIT_BUCKETS = (1, 5, 15, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600)  # a ticket waits minutes to hours


class _Families:
    """A collector that yields metric families made beforehand (one scrape's reads)."""

    def __init__(self, families: list):
        self.families = families

    def collect(self) -> list:
        return self.families


class LabMetrics:
    """This process's counters, and the exposition of them with the lab's gauges (devices
    are counted in each of ``states``, zeros too: a graph shows a state emptying)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, states: tuple[str, ...], metrics_sql: MetricQueries):
        self.states = states
        self.metrics_sql = metrics_sql
        self.registry = CollectorRegistry(auto_describe=False)
        self.leases_granted = Counter("device_loop_leases_granted", "Leases this process granted",
                                      registry=self.registry)
        self.leases_ended = Counter("device_loop_leases_ended", "Leases this process ended, by how they ended",
                                    ["reason"], registry=self.registry)
        self.reserve_ready = Histogram("device_loop_reserve_ready_seconds",
                                       "From reserve to the lease's services up (the lease active), for the leases "
                                       "this process saw become ready", buckets=READY_BUCKETS, registry=self.registry)
        self.ticket_waits = Histogram("device_loop_ticket_wait_seconds", "From a queue ticket's making to its grant, "
                                      "for the tickets this process granted, by kind (interactive, batch)", ["kind"],
                                      buckets=WAIT_BUCKETS, registry=self.registry)
        self.operations = Counter("device_loop_operations", "Operations on devices that ended here (flashes "
                                  "among them), by kind and outcome", ["kind", "outcome"], registry=self.registry)

    def leases_ready(self, waited_s: list[float]) -> None:
        for seconds in waited_s:
            self.reserve_ready.observe(max(0.0, seconds))

    async def exposition(self, now: float) -> bytes:
        """The text format: the lab as the database has it, then this process's counters."""
        devices = GaugeMetricFamily("device_loop_devices", "Devices by state and class", labels=["state", "class"])
        counts = {(r["state"], r["class"]): r["n"] for r in await self.metrics_sql.device_counts()}
        for device_class in sorted({c for _, c in counts}):
            for state in self.states:
                devices.add_metric([state, device_class], counts.get((state, device_class), 0))
        leases = GaugeMetricFamily("device_loop_leases_live", "Live leases in the lab, by state", labels=["state"])
        live = await self.metrics_sql.live_lease_counts()
        for state in LIVE_LEASE_STATES:
            leases.add_metric([state], live.get(state, 0))
        age = GaugeMetricFamily("device_loop_host_heartbeat_age_seconds", "Seconds since each host's last heartbeat",
                                labels=["host"])
        online = GaugeMetricFamily("device_loop_host_online", "1 while a host is online", labels=["host"])
        for host in await self.metrics_sql.host_heartbeats():
            age.add_metric([host["name"]], round(now - host["last_seen"], 3))
            online.add_metric([host["name"]], int(host["online"]))
        waiting = GaugeMetricFamily("device_loop_tickets_waiting", "Queue tickets waiting, by the class they wait "
                                    "for (a named device's) and kind", labels=["class", "kind"])
        for row in await self.metrics_sql.waiting_ticket_counts():
            waiting.add_metric([row["class"], row["kind"]], row["n"])
        plugins = await self.plugin_gauges()
        tokens = await self.token_gauge(now)
        return (generate_latest(_Families([devices, leases, age, online, waiting, tokens, *plugins]))
                + generate_latest(self.registry))

    async def token_gauge(self, now: float) -> GaugeMetricFamily:
        """``device_loop_token_device_seconds{token, user, period, state}``: what each scoped
        token's leases hold ahead and have used of its budget, today (UTC) or over its life
        (docs/architecture.md, "Shares of one lab")."""
        family = GaugeMetricFamily("device_loop_token_device_seconds", "Device-seconds of each budgeted token's "
                                   "leases, held ahead by live ones and used by ended ones, in its budget's current "
                                   "period (day: today UTC; token: its life)",
                                   labels=["token", "user", "period", "state"])
        for row in await self.metrics_sql.token_usage([period_of(now, BudgetPeriod.DAY),
                                                        period_of(now, BudgetPeriod.TOKEN)]):
            period = period_kind(row["period"]).value
            family.add_metric([row["token_id"], row["username"], period, "held"], round(row["held_s"], 3))
            family.add_metric([row["token_id"], row["username"], period, "used"], round(row["used_s"], 3))
        return family

    async def plugin_gauges(self) -> list[GaugeMetricFamily]:
        """``device_loop_plugin_NAME{host, plugin}``: each online host's plugins' metrics as
        its last heartbeat carried them (checked there: names and bounds are the protocol's)."""
        families: dict[str, GaugeMetricFamily] = {}
        for host in await self.metrics_sql.online_host_plugins():
            for said in (host["plugins"] or {}).get("metrics", []):
                try:
                    entry = PluginMetrics.model_validate(said)
                except ValidationError:  # (a row written before the protocol had them, or by hand)
                    continue
                for name, value in sorted(entry.values.items()):
                    family = families.get(name)
                    if family is None:
                        family = families[name] = GaugeMetricFamily(
                            f"device_loop_plugin_{name}", f"What plugins measure of themselves: {name} "
                            "(devloop_metrics), by host and plugin", labels=["host", "plugin"])
                    family.add_metric([host["name"], entry.plugin], value)
        return [families[name] for name in sorted(families)]
