"""The steps between leases in the exporter's config: [[devices.steps]] and [[classes.NAME.steps]]
parse with their defaults; every mistake is refused when the config loads (or, for what only
the plugins know, when the exporter starts), named by file, device or class, step and key."""
import pytest

from device_loop.core.ports import free_port
from device_loop.core.model import Resource, StepKind
from device_loop.core.protocol import EXPORTER_STEPS
from device_loop.exporter.steps import plan
from device_loop.exporter.config import (DEFAULT_PROMPT, CommandStep, ConfigError, CooldownStep, PluginStepConfig,
                                         RebootStep, ReflashStep, check_steps, load_config, parse_config)
from device_loop.exporter.daemon import Exporter

pytestmark = [pytest.mark.service, pytest.mark.timeout(30)]

FLASHED = [{"plugin": "sim"}, {"plugin": "flash", "target": "/tmp/nowhere.img"}]


def refusal(data: dict) -> str:
    with pytest.raises(ConfigError) as refused:
        parse_config(data, "lab.toml")
    return str(refused.value)


def test_steps_of_a_device_and_of_its_class(tmp_path):
    path = tmp_path / "exporter.toml"
    path.write_text('''
[[devices]]
name = "b0"
class = "board"
plugin = "sim"
[[devices.steps]]
step = "cooldown"
below = "45 °C"
[[devices.steps]]
step = "command"
command = "/usr/local/bin/reset-usb --port '{device} a'"
timeout = "90s"

[[devices]]
name = "b1"
class = "board"
plugin = "sim"

[[devices]]
name = "b2"
class = "board"
[[devices.resources]]
plugin = "sim"
[[devices.resources]]
plugin = "flash"
target = "/tmp/b2.img"
[[devices.steps]]
step = "reflash"
[[devices.steps]]
step = "reboot"
prompt = "login: ?$"
line_ending = "\\r\\n"
settle = true

[classes.board]
[[classes.board.steps]]
step = "cooldown"
below = 50.5
timeout = "2m"
settle = false
''')
    config = load_config(path)
    own = config.steps_of("b0", "board")
    assert [type(step) for step in own] == [CooldownStep, CommandStep]
    assert (own[0].below, own[0].timeout_for(), own[0].settles) == (45.0, 600.0, True), "cooldown: 10m, settles"
    assert own[1].argv("b0") == ["/usr/local/bin/reset-usb", "--port", "b0 a"], "split as a shell would, no shell"
    assert (own[1].timeout_for(), own[1].settles) == (90.0, False)
    (shared,) = config.steps_of("b1", "board")
    assert (shared.below, shared.timeout_for(), shared.settles) == (50.5, 120.0, False), "the class's, as written"
    assert config.steps_of("android-X", "board") == [shared], "a device discovery found gets its class's steps"
    assert config.steps_of("other", "generic") == []
    reflash, reboot = config.steps_of("b2", "board")
    assert isinstance(reflash, ReflashStep) and (reflash.timeout_for(), reflash.settles) == (1800.0, False)
    assert isinstance(reboot, RebootStep)
    assert (reboot.command, reboot.prompt, reboot.line_ending, reboot.timeout_for(), reboot.settles) == (
        "reboot", "login: ?$", "\r\n", 300.0, True)
    assert config.entries()[0].settings == {}, "steps are not the plugin's settings"


@pytest.mark.parametrize("below, degrees", [(45, 45.0), (45.5, 45.5), ("45C", 45.0), ("45 °C", 45.0),
                                            ("45°C", 45.0), (" 38.5 c ", 38.5)])
def test_a_threshold_is_written_as_people_write_temperatures(below, degrees):
    config = parse_config({"devices": [{"name": "b0", "plugin": "sim", "steps": [{"step": "cooldown",
                                                                                  "below": below}]}]})
    assert config.steps_of("b0", "generic")[0].below == degrees


def test_reboot_defaults_match_the_sim_board_s_prompt_and_common_shells():
    (reboot,) = parse_config({"devices": [{"name": "b0", "plugin": "sim", "steps": [{"step": "reboot"}]}]}
                             ).steps_of("b0", "generic")
    assert (reboot.command, reboot.prompt, reboot.line_ending) == ("reboot", DEFAULT_PROMPT, "\r")
    import re
    assert all(re.search(DEFAULT_PROMPT, p) for p in ("b0:~# ", "root@pi:/# ", "user@x:~$ ", "$"))


@pytest.mark.parametrize("step, complaint", [
    ({"step": "cooldown"}, "device 'b0', step 1 (cooldown): below: Field required"),
    ({"step": "cooldown", "below": "hot"}, "below: not a temperature: 'hot'"),
    ({"step": "cooldown", "below": True}, "below: not a temperature: True"),
    ({"step": "cooldown", "below": 45, "belwo": 40}, "unknown key 'belwo'; did you mean 'below'?"),
    ({"step": "cooldown", "below": 45, "timeout": "forever"}, "timeout: not a duration: 'forever'"),
    ({"step": "cooldown", "below": 45, "timeout": "8d"}, "timeout: a step may take 7 days at most"),
    ({"step": "cooldown", "below": 45, "settle": "yes"}, "settle: Input should be a valid boolean"),
    ({"step": "command"}, "command: Field required"),
    ({"step": "command", "command": []}, "command: give the program to run"),
    ({"step": "command", "command": "run 'this"}, "command: cannot be split into arguments"),
    ({"step": "command", "command": ["ok", 3]}, "command.1: Input should be a valid string"),
    ({"step": "reboot", "prompt": "(["}, "prompt: not a regular expression"),
    ({"step": "reboot", "line_ending": "\t"}, "line_ending: one of"),
    ({"step": "reboot", "comand": "reset"}, "unknown key 'comand'; did you mean 'command'?"),
    ({"step": "reflash", "image": "x"}, "step 1 (reflash): unknown key 'image'; its keys are timeout, settle"),
    ({"step": "reflash", "settle": True}, "a reflash cannot settle"),
    ({"timeout": "5m"}, "device 'b0', step 1: say which step it is"),
    ({"step": "Cool Down"}, "step 'Cool Down' is not a step's name"),
    ({"step": "wait-boot", "how": ["a"]}, "how: a step's setting is a text, a number or true/false"),
])
def test_a_bad_step_is_refused_at_load_naming_the_device_the_step_and_the_key(step, complaint):
    said = refusal({"devices": [{"name": "b0", "resources": FLASHED, "steps": [step]}]})
    assert said.startswith("lab.toml is not a valid exporter config:") and complaint in said, said


def test_a_class_s_bad_step_names_the_class_and_counts_from_one():
    said = refusal({"classes": {"board": {"steps": [{"step": "cooldown", "below": 40},
                                                    {"step": "command", "command": ""}]}}})
    assert "class 'board', step 2 (command): command: give the program to run" in said, said
    assert "step 1" not in said


def test_unknown_tables_and_keys_of_classes_are_named_with_the_closest_one():
    assert "an exporter config has no [class]; did you mean [classes.NAME]?" in refusal({"class": {"b": {}}})
    assert "unknown key 'step' in [classes.board]; did you mean 'steps'?" in refusal(
        {"classes": {"board": {"step": []}}})
    assert "a class name takes 1 to 64 characters" in refusal({"classes": {"x" * 65: {}}})


def test_a_reflash_runs_on_the_device_s_resource_of_kind_flash_whichever_plugin_serves_it():
    """(docs/architecture.md, "Steps between leases"): no plugin name is spelled for it; a device
    with no flash resource is told so where the step runs (its plugins may serve one the file
    cannot know of)."""
    config = parse_config({"classes": {"board": {"steps": [{"step": "reflash"}]}},
                           "devices": [{"name": "b1", "class": "board", "resources": [{"plugin": "sim"},
                                                                                      {"plugin": "acme-writer"}]}]})
    console = Resource(device="b1", kind="uart", identifier="sim:b1", plugin="sim")
    target = Resource(device="b1", kind="flash", identifier="acme:b1", plugin="acme-writer")
    (step,) = plan(config.steps_of("b1", "board"), [console, target], {})
    assert (step.plugin, step.identifier, step.problem) == ("acme-writer", "acme:b1", None)
    (step,) = plan(config.steps_of("b1", "board"), [console], {})
    assert step.plugin == EXPORTER_STEPS and "b1 has no flash resource here to reflash" in step.problem


def test_a_third_party_power_plugin_s_device_may_power_cycle_and_auto_recover():
    """A power switch is a resource of kind power, whichever plugin serves it: the config asks
    for no plugin called power (a device with none is told where the step runs, or the
    coordinator notes it has no switch to cycle)."""
    config = parse_config({"devices": [{"name": "b1", "auto_recover": "power-cycle",
                                        "resources": [{"plugin": "sim"}, {"plugin": "acme-pdu"}],
                                        "steps": [{"step": "power-cycle"}]}]})
    assert [s.kind() for s in config.steps_of("b1", "generic")] == ["power-cycle"]
    assert config.auto_recovery() == {"b1": "power-cycle"}


def test_the_exporter_refuses_at_start_a_step_no_plugin_offers(tmp_path):
    config = parse_config({
        "exporter": {"name": "host-a", "state_dir": str(tmp_path), "cdi_dir": str(tmp_path / "cdi"), "coordinator": f"http://127.0.0.1:{free_port()}"},
        "devices": [{"name": "b0", "plugin": "sim", "steps": [{"step": "cooldwn", "below": 40}]}]})
    assert isinstance(config.steps_of("b0", "generic")[0], PluginStepConfig), "a plugin's, as far as the file says"
    with pytest.raises(ConfigError) as refused:
        Exporter(config).check_config()
    said = str(refused.value)
    assert "device 'b0', step 1 (cooldwn): no built-in step and no plugin loaded here is called 'cooldwn'" in said
    assert "did you mean 'cooldown'?" in said and "wait-boot (adb)" in said, said


def test_a_plugin_step_takes_only_the_keys_its_kind_declares_on_a_device_that_has_its_plugin():
    offered = {"adb": [StepKind("wait-boot", "boot", settings={"props": "what must be set"})],
               "relay": [StepKind("relay-cycle", "off and on")]}
    config = parse_config({"devices": [
        {"name": "p", "plugin": "adb", "serial": "X", "steps": [{"step": "wait-boot", "prop": "x"},
                                                                 {"step": "relay-cycle", "seconds": 3}]},
        {"name": "q", "plugin": "adb", "serial": "Y", "steps": [{"step": "wait-boot", "props": "a"}]}]})
    with pytest.raises(ConfigError) as refused:
        check_steps(config, offered)
    said = str(refused.value)
    assert "device 'p', step 1 (wait-boot): unknown key 'prop' of step 'wait-boot' (plugin adb); did you mean " \
           "'props'?" in said, said
    assert "step 2 (relay-cycle): unknown key 'seconds' of step 'relay-cycle' (plugin relay); it takes no keys" in said
    assert "device 'p': step 2 (relay-cycle) is plugin relay's, and the device has no resource of it" in said
    assert "'q'" not in said
    check_steps(parse_config({"devices": [{"name": "q", "plugin": "adb", "serial": "Y",
                                           "steps": [{"step": "wait-boot", "props": "a", "timeout": "1m"}]}]}),
                offered)
