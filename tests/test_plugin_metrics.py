"""What plugins measure of themselves (``devloop_metrics``): the rule its docstring states
(names ``[a-z][a-z0-9_]*`` of at most 64 characters, at most 64 a plugin, finite numbers),
held by the exporter before a report and by the protocol at the coordinator, and each
online host's latest answer on ``GET /metrics`` as ``device_loop_plugin_NAME{host, plugin}``."""
from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from device_loop.core.hookspecs import hookimpl
from device_loop.core.host import HostContext
from device_loop.core.plugins import PluginSet
from device_loop.core.protocol import MAX_PLUGIN_METRICS, PluginMetrics, PluginsReport
from device_loop.exporter.orphans import OrphanWatch
from device_loop.exporter.report import Reporter, plugin_metric_values
from lab_in_process import FakeExporter, device, in_process_lab

SITE = "http://127.0.0.1"  # the in-process clients' base URL is SITE/api/v1


def test_a_good_answer_is_kept_as_floats():
    assert plugin_metric_values({"pool_size": 2, "boot_seconds_p50": 2.75, "waits": 0}) == (
        {"pool_size": 2.0, "boot_seconds_p50": 2.75, "waits": 0.0}, "")
    assert plugin_metric_values(None) == ({}, "")
    assert plugin_metric_values({}) == ({}, "")


@pytest.mark.parametrize("name", ["Pool", "1pool", "pool-size", "pool.size", "", "p" * 65, "pöol", 7, None,
                                  "pool size", "pool\n"])
def test_a_name_that_breaks_the_rule_is_dropped_alone_and_said(name):
    values, dropped = plugin_metric_values({name: 1, "pool_size": 3})
    assert values == {"pool_size": 3.0}
    assert "a name is [a-z][a-z0-9_]*" in dropped


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 10 ** 400, True, "3", None, [1], {}])
def test_a_value_that_is_not_a_finite_number_is_dropped_alone_and_said(value):
    values, dropped = plugin_metric_values({"boots": value, "pool_size": 3})
    assert values == {"pool_size": 3.0}
    assert dropped.startswith("boots: ") and "not a finite number" in dropped


def test_an_answer_of_too_many_names_or_of_no_dict_is_dropped_whole():
    assert plugin_metric_values({f"m{n}": n for n in range(MAX_PLUGIN_METRICS)})[0].keys() == {
        f"m{n}" for n in range(MAX_PLUGIN_METRICS)}
    values, dropped = plugin_metric_values({f"m{n}": n for n in range(10_000)})
    assert values == {} and "10000 metrics; a plugin reports 64 at most" in dropped
    for said in ([("pool_size", 1)], "pool_size=1", 3):
        values, dropped = plugin_metric_values(said)
        assert values == {} and "not a dict" in dropped


def test_many_bad_names_make_a_bounded_reason():
    values, dropped = plugin_metric_values({"X" * 60 + str(n): 1 for n in range(MAX_PLUGIN_METRICS)})
    assert values == {} and len(dropped) <= 2000


def test_the_protocol_refuses_what_the_rule_refuses():
    for hostile in ({"values": {"pool_size": float("nan")}}, {"values": {"Pool": 1}},
                    {"values": {f"m{n}": 1 for n in range(MAX_PLUGIN_METRICS + 1)}},
                    {"values": {"p" * 65: 1}}, {"values": {"pool\n": 1}}, {"dropped": "x" * 2001}):
        with pytest.raises(ValidationError):
            PluginMetrics.model_validate({"plugin": "qemu", **hostile})
    with pytest.raises(ValidationError):
        PluginsReport.model_validate({"metrics": [{"plugin": f"p{n}"} for n in range(257)]})


class Pool:
    """A plugin that measures itself (as the qemu plugin's warm pool does), or answers badly."""

    def __init__(self, answer):
        self.answer = answer

    @hookimpl
    def devloop_metrics(self, host):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def reporter(tmp_path, **plugins) -> Reporter:
    loaded = PluginSet(enable=[])
    for name, plugin in plugins.items():
        loaded.pm.register(plugin, name=name)
    host = HostContext("host-a", tmp_path / "state")
    made = Reporter(host, loaded, OrphanWatch(host.state_dir), 1.0, "boot-1")
    made.loaded = list(plugins)
    made.scan(set())
    return made


def test_the_exporter_reports_each_plugins_metrics_and_what_it_dropped(tmp_path):
    made = reporter(tmp_path, pool=Pool({"pool_size": 1, "boots": 4, "Bad": 2}), broken=Pool(RuntimeError("no pool")),
                    flood=Pool({f"m{n}": n for n in range(10_000)}), quiet=Pool(None))
    plugins = made.build([], set(), set()).plugins
    got = {m.plugin: (m.values, m.dropped) for m in plugins.metrics}
    assert got["pool"][0] == {"pool_size": 1.0, "boots": 4.0} and "'Bad'" in got["pool"][1]
    assert got["broken"] == ({}, "devloop_metrics failed: RuntimeError('no pool')")
    assert got["flood"][0] == {} and "10000 metrics" in got["flood"][1]
    assert "quiet" not in got  # nothing to say: no entry


def sample(text: str, name: str, **labels) -> float | None:
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and found.labels == labels:
                return found.value
    return None


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_a_plugins_metrics_reach_metrics_as_gauges_by_host_and_plugin(tmp_path):
    pools = Pool({"pool_size": 1, "boots": 4})
    made = reporter(tmp_path, qemu=pools, other=Pool({"pool_size": 7, "Bad": 1}))
    async with in_process_lab(tmp_path) as (client, rules, clock):
        api = client()
        report = made.build([], set(), set()).model_dump(mode="json", by_alias=True)
        assert (await api.post("/hosts/host-a/heartbeat", json=report)).status_code == 200
        text = (await api.get(f"{SITE}/metrics")).text
        assert sample(text, "device_loop_plugin_pool_size", host="host-a", plugin="qemu") == 1
        assert sample(text, "device_loop_plugin_pool_size", host="host-a", plugin="other") == 7
        assert sample(text, "device_loop_plugin_boots", host="host-a", plugin="qemu") == 4
        pools.answer = {"pool_size": 0}  # the latest snapshot stands: a name no longer said goes away
        made.scan(set())
        report = made.build([], set(), set()).model_dump(mode="json", by_alias=True)
        assert (await api.post("/hosts/host-a/heartbeat", json=report)).status_code == 200
        text = (await api.get(f"{SITE}/metrics")).text
        assert sample(text, "device_loop_plugin_pool_size", host="host-a", plugin="qemu") == 0
        assert sample(text, "device_loop_plugin_boots", host="host-a", plugin="qemu") is None
        hosts = (await api.get("/hosts")).json()
        said = {m["plugin"]: m for m in hosts[0]["plugins"]["metrics"]}
        assert said["qemu"] == {"plugin": "qemu", "values": {"pool_size": 0.0}, "dropped": ""}
        assert said["other"]["values"] == {"pool_size": 7.0} and "'Bad': a name is" in said["other"]["dropped"]


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_a_hostile_exporters_metrics_are_refused_with_a_reason(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):
        exporter = FakeExporter(client(), "host-a")
        for metrics in ([{"plugin": "qemu", "values": {"pool_size": "NaN"}}],
                        [{"plugin": "qemu", "values": {f"m{n}": 1 for n in range(10_000)}}],
                        [{"plugin": "qemu", "values": {"Pool-Size": 1}}],
                        [{"plugin": "qemu", "values": {"x": 1}, "extra": 1}]):
            refused = await exporter.beat([device("b0")], plugins={"loaded": ["qemu"], "metrics": metrics})
            assert refused.status_code == 422 and "metrics" in refused.json()["message"], refused.text[:300]
        text = (await client().get(f"{SITE}/metrics")).text
        assert "device_loop_plugin_" not in text
