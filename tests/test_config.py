"""Exporter config: every form the docs show parses; mistakes are named clearly."""
import pytest

from device_loop.exporter.config import ConfigError, load_config, parse_config

pytestmark = pytest.mark.timeout(10)


def test_shorthand_and_multi_resource_devices(tmp_path):
    path = tmp_path / "exporter.toml"
    path.write_text('''
[exporter]
name = "bench-3"
coordinator = "http://coord:7420"
heartbeat_s = 2
sysfs_root = "/tmp/fake-sys"
state_dir = "/tmp/state"

[plugins]
disable = ["video"]

[[devices]]
name = "sim-board-0"
plugin = "sim"
baud = 9600

[[devices]]
name = "jupiter"
class = "riscv-sbc"
tags = ["rack-2"]
[[devices.resources]]
plugin = "uart"
path = "/dev/serial/by-id/usb-FTDI_X-if00"
[[devices.resources]]
plugin = "sim"
''')
    config = load_config(path)
    assert config.exporter.name == "bench-3" and config.exporter.heartbeat_s == 2
    assert config.plugins.disable == ["video"] and config.plugins.enable is None
    entries = config.entries()
    assert [(e.device, e.device_class, e.plugin, e.where) for e in entries] == [
        ("sim-board-0", "generic", "sim", "device 'sim-board-0'"), ("jupiter", "riscv-sbc", "uart", "device 'jupiter', resource 1"),
        ("jupiter", "riscv-sbc", "sim", "device 'jupiter', resource 2")]
    assert entries[0].settings == {"baud": 9600} and entries[1].tags == ("rack-2",)
    assert entries[1].settings == {"path": "/dev/serial/by-id/usb-FTDI_X-if00"}, "plugin is not a setting"
    assert config.source == str(path)
    assert str(config.state_dir) == "/tmp/state"


@pytest.mark.parametrize("data, complaint", [
    ({"exporter": {"heartbeat_s": 0}}, "exporter.heartbeat_s"),
    ({"exporter": {"nmae": "x"}}, "exporter.nmae"),
    ({"devices": [{"name": "a"}]}, "needs 'plugin'"),
    ({"devices": [{"name": "a", "plugin": "sim", "resources": [{"plugin": "uart"}]}]}, "not both"),
    ({"devices": [{"name": "a", "plugin": "sim"}, {"name": "a", "plugin": "sim"}]}, "appear twice: a"),
    ({"devices": [{"name": "lease-7", "plugin": "sim"}]}, "must not start with 'lease-'"),
    ({"devices": [{"name": "bad name", "plugin": "sim"}]}, "devices.0.name"),
    # what heartbeats must keep to is refused here, not by a coordinator at every report
    ({"exporter": {"advertise_address": "http://bench-3:80"}}, "exporter.advertise_address"),
    ({"exporter": {"advertise_address": "fe80::1::2"}}, "exporter.advertise_address"),
    ({"devices": [{"name": "a", "plugin": "sim", "tags": ["x" * 65]}]}, "devices.0.tags.0"),
])
def test_mistakes_are_named(data, complaint):
    with pytest.raises(ConfigError, match="not a valid exporter config") as err:
        parse_config(data)
    assert complaint in str(err.value)


def test_unreadable_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[exporter\nname = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(broken)


@pytest.mark.parametrize("text, said", [
    ('[[device]]\nname = "jupiter"\nplugin = "sim"\n',
     "device: an exporter config has no [[device]]; did you mean [[devices]]?"),
    ('[exporter]\nnmae = "bench-3"\n', "exporter.nmae: unknown key 'nmae' in [exporter]; did you mean 'name'?"),
    ('[plugins]\ndisabel = ["video"]\n',
     "plugins.disabel: unknown key 'disabel' in [plugins]; did you mean 'disable'?"),
    ('name = "bench-3"\n', "name: 'name' belongs in the table [exporter]: put it below a line [exporter]"),
    ('[cameras]\nfps = 5\n', "cameras: an exporter config has no [cameras]; its tables are [exporter], [plugins], "
                            "[[devices]]"),
])
def test_a_misspelt_table_or_key_is_named_with_its_table_and_the_closest_known(tmp_path, text, said):
    path = tmp_path / "exporter.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path} is not a valid exporter config:\n  {said}"
