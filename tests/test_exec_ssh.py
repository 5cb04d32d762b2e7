"""exec over the ``ssh`` kind (plugins/ssh): Debian's sshd on a loopback port with a throwaway
host key, relayed by a real exporter behind the lease gate of a lab with tokens. A client
(the CLI, the Python client) pins the host key of the exporter's config, or of its user's own
known_hosts, and logs in with the caller's key (--identity). The coordinator's MCP exec logs
in only as its own --ssh-logins file says: a rogue exporter that relays a board's ssh to
another host's sshd (a second sshd here, which takes the coordinator's key too) reaches
nothing with it."""
import dataclasses
import getpass
import json
import os
import subprocess

import pytest
import tomli_w

from conftest import Coordinator, Exporter, lab_tokens, wait_for
from device_loop.client.lab import Lab, Lease
from device_loop.coordinator.ssh_logins import SshLoginsError, load_ssh_logins
from device_loop.core.device_exec import KNOWN_HOSTS_ENV, ExecError, SshLogin
from device_loop.core.ports import free_port, port_is_free
from device_loop.plugins.ssh import SshConfig
from helpers import run_cli, wait_state
from test_exec_console import environment
from test_mcp import agent

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]
SSHD = "/usr/sbin/sshd"


def keypair(path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test", "-f", str(path)], check=True,
                   timeout=30)
    return path, path.with_suffix(".pub").read_text().strip()


class Sshd:
    """sshd in the foreground on a free loopback port, as whoever runs the tests: a host key,
    the authorized keys (alice's, and ``authorized``) and its pid file in ``folder``."""

    def __init__(self, folder, *authorized):
        folder.mkdir()
        self.host_key_file, self.host_key = keypair(folder / "host_key")
        self.identity, alice = keypair(folder / "id_alice")
        (folder / "authorized_keys").write_text("\n".join([alice, *authorized]) + "\n")
        self.user, self.port = getpass.getuser(), free_port()
        config = folder / "sshd_config"
        config.write_text(f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.host_key_file}\n"
                          f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPidFile {folder / 'sshd.pid'}\n"
                          "StrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                          "PermitRootLogin prohibit-password\n")
        if os.geteuid() == 0:
            # as root sshd wants its privilege separation folder, which its service makes at boot
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.log = folder / "sshd.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: self.proc.poll() is not None or not port_is_free("127.0.0.1", self.port),
                 what="sshd listening")
        assert self.proc.poll() is None, self.log.read_text()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


@dataclasses.dataclass
class SshLab:
    sshd: Sshd        # the boards' sshd
    other: Sshd       # another host's sshd, which takes the coordinator's key too
    lab: Lab          # alice's
    alice: dict       # her environment
    token: str        # her token
    coordinator: Coordinator
    leases: dict[str, Lease]


@pytest.fixture(scope="module")
def ssh_lab(tmp_path_factory):
    """One lab for the module: ``vm`` with the board's host key pinned, ``impostor`` pinned to
    another key, ``unpinned`` without one; for the coordinator's own logins, ``wrong-user``
    (reported with another user), ``hijacked`` (a rogue report: relayed to the other host's
    sshd, that host's key pinned), ``unlisted`` (no login) and ``consoled`` (no login, and a
    console)."""
    tmp_path = tmp_path_factory.mktemp("ssh-lab")
    env = environment(tmp_path)
    coordinator_key, coordinator_public = keypair(tmp_path / "coordinator_key")
    sshd, other = Sshd(tmp_path / "sshd", coordinator_public), Sshd(tmp_path / "other", coordinator_public)
    _, other_key = keypair(tmp_path / "other_host_key")
    login = {"user": sshd.user, "identity": str(coordinator_key), "host_key": sshd.host_key}
    logins = tmp_path / "ssh-logins.toml"
    logins.write_text(tomli_w.dumps({"devices": {"vm": login, "wrong-user": login, "hijacked": login}}))
    # before the coordinator had logins of its own, an admin gave it its key so (and the report the rest)
    coordinator_env = {**env, "DEVICE_LOOP_SSH_IDENTITY": str(coordinator_key)}
    coordinator = Coordinator(tmp_path, coordinator_env, extra=("--ssh-logins", str(logins)))
    tokens, token_file = lab_tokens(env, coordinator, tmp_path, "alice")
    board = {"plugin": "ssh", "port": sshd.port, "user": sshd.user}
    devices = [{"name": "vm", "class": "vm", "resources": [{**board, "host_key": sshd.host_key + " root@board"}]},
               {"name": "wrong-user", "class": "vm", "resources": [{**board, "host_key": sshd.host_key,
                                                                    "user": "nobody"}]},
               {"name": "impostor", "class": "vm", "resources": [{**board, "host_key": other_key}]},
               {"name": "unpinned", "class": "vm", "resources": [board]},
               {"name": "hijacked", "class": "vm", "resources": [{**board, "port": other.port,
                                                                  "host_key": other.host_key}]},
               {"name": "unlisted", "class": "vm", "resources": [{**board, "host_key": sshd.host_key}]},
               {"name": "consoled", "class": "sim-board", "resources": [{"plugin": "sim", "workload_s": 0.05},
                                                                         {**board, "host_key": sshd.host_key}]}]
    exporter = Exporter(tmp_path, env, coordinator.url, devices, token_file=str(token_file))
    lab = Lab(coordinator.url, token=tokens["alice"])
    try:
        names = [d["name"] for d in devices]
        for name in names:
            wait_state(coordinator, name, "idle")
        leases = {name: lab.reserve(name).wait_ready() for name in names}
        yield SshLab(sshd, other, lab, {**env, "DEVICE_LOOP_TOKEN": tokens["alice"]}, tokens["alice"], coordinator,
                     leases)
    finally:
        lab.api.close()
        exporter.stop()
        coordinator.stop()
        sshd.stop()
        other.stop()


def test_exec_over_ssh_with_the_host_key_pinned(ssh_lab):
    sshd, leases = ssh_lab.sshd, ssh_lab.leases
    lease = leases["vm"]
    (endpoint,) = lease.endpoints
    assert (endpoint["kind"], endpoint["role"], endpoint["protocol"]) == ("ssh", "ssh", "ssh")
    assert endpoint["params"] == {"user": sshd.user, "host_key": sshd.host_key.rsplit(" ", 1)[0]}, \
        "the key as the exporter's config pins it, without its comment"
    assert endpoint["secret"] and any(c.startswith("ssh -p ") for c in lease.data["commands"])
    said = lease.exec("echo hi; echo err >&2; exit 3", identity_file=str(sshd.identity))
    assert (said.stdout, said.stderr, said.status, said.channel) == ("hi\n", "err\n", 3, "ssh")
    assert lease.exec("uname -s", identity_file=str(sshd.identity)).stdout == "Linux\n"
    assert leases["unpinned"].exec("true", identity_file=str(sshd.identity)).status == 0, "nothing to pin: any key"

    with pytest.raises(ExecError) as wrong_key:
        leases["impostor"].exec("true", identity_file=str(sshd.identity))
    assert wrong_key.value.code == "unreachable" and "ssh to impostor failed" in wrong_key.value.message
    assert "host key" in wrong_key.value.message.lower() or "IDENTIFICATION" in wrong_key.value.message
    with pytest.raises(ExecError) as not_authorized:
        lease.exec("true", identity_file=str(sshd.host_key_file))  # a key the board does not know
    assert not_authorized.value.code == "unreachable" and "Permission denied" in not_authorized.value.message


def test_ssh_output_is_bounded_and_a_command_that_overstays_is_stopped(ssh_lab):
    sshd, lease = ssh_lab.sshd, ssh_lab.leases["unpinned"]
    cut = lease.exec("head -c 200000 /dev/zero | tr '\\0' x; echo done >&2", identity_file=str(sshd.identity),
                     max_output=1000)
    assert cut.truncated and cut.stdout == "x" * 1000 and cut.stderr.startswith("done\n")
    assert "stdout cut at 1000 bytes" in cut.stderr
    with pytest.raises(ExecError) as timed_out:
        lease.exec("sleep 30", timeout_s=1, identity_file=str(sshd.identity))
    assert timed_out.value.code == "timeout"


def test_the_cli_over_ssh(ssh_lab):
    sshd, alice, url = ssh_lab.sshd, ssh_lab.alice, ssh_lab.coordinator.url
    done = run_cli(alice, url, "exec", "unpinned", "--identity", str(sshd.identity), "--",
                   "echo out; echo err >&2; exit 5", check=False)
    assert (done.returncode, done.stdout, done.stderr) == (5, "out\n", "err\n")
    keyed = {**alice, "DEVICE_LOOP_SSH_IDENTITY": str(sshd.identity)}
    answer = json.loads(run_cli(keyed, url, "exec", "unpinned", "--json", "--", "echo", "hi").stdout)
    assert (answer["stdout"], answer["status"], answer["channel"]) == ("hi\n", 0, "ssh")


def test_the_config_of_an_ssh_board():
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDbXtzs1P1cLvGJ0Sk4bI1kGzG3l3o5ryT2HxvOqK5mP"
    assert SshConfig.model_validate({"port": 2222, "host_key": key + " root@board"}).host_key == key
    assert (SshConfig().host, SshConfig().port, SshConfig().user) == ("127.0.0.1", 22, "root")
    for bad, says in [({"host_key": "not a key"}, "public key"), ({"host_key": "ssh-dss AAAA"}, "public key"),
                      ({"host_key": "ssh-rsa " + "A" * 372}, "ed25519 or ecdsa"), ({"host": "a b"}, "DNS name"),
                      ({"port": 0}, "greater than"), ({"user": "x;rm"}, "pattern"), ({"password": "x"}, "extra")]:
        with pytest.raises(ValueError, match=says):
            SshConfig.model_validate(bad)


def test_an_exporter_s_ssh_user_is_never_an_option_of_ssh(tmp_path):
    """An exporter's token can be stolen: the user its endpoint names goes to ssh as text,
    never as an option (``-oProxyCommand=...`` would run a program here)."""
    from device_loop.core.device_exec import exec_on_lease

    planted = tmp_path / "planted"
    for user in (f"-oProxyCommand=touch {planted}", "root -oProxyCommand=x", "a@b"):
        lease = {"id": "lease-x", "device": "b0", "ready": True, "endpoints": [
            {"kind": "ssh", "role": "ssh", "host": "127.0.0.1", "port": free_port(), "params": {"user": user}}]}
        with pytest.raises(ExecError) as refused:
            exec_on_lease(lease, "true", 5)
        assert refused.value.code == "unreachable" and "not a login name" in refused.value.message
    assert not planted.exists()


async def mcp_exec(ssh_lab: SshLab, device: str, command: str):
    """An MCP exec of alice's agent on ``device``: (its answer, or None; the error's text)."""
    async with agent(ssh_lab.coordinator.url, ssh_lab.token) as bot:
        result = await bot.call_tool("exec", {"lease_id": ssh_lab.leases[device].id, "command": command})
    return (None if result.is_error else result.structured_content), result.content[0].text if result.content else ""


def logins_of(sshd: Sshd) -> list[str]:
    return [line for line in sshd.log.read_text().splitlines() if "Accepted publickey" in line]


@pytest.mark.anyio
async def test_the_coordinator_logs_in_as_its_own_config_says_never_as_a_report_does(ssh_lab, tmp_path):
    sshd, other = ssh_lab.sshd, ssh_lab.other
    answer, said = await mcp_exec(ssh_lab, "vm", "echo $SSH_CONNECTION; whoami")
    assert answer is not None, said
    assert answer["channel"] == "ssh" and answer["stdout"].split()[3] == str(sshd.port), answer
    answer, said = await mcp_exec(ssh_lab, "wrong-user", "whoami")
    assert answer is not None and answer["stdout"] == f"{sshd.user}\n", "the user is the config's, not the report's"

    # a rogue exporter relays hijacked's ssh to another host's sshd, and reports that host's key as the pin
    before = len(logins_of(other))
    planted = tmp_path / "ran-on-the-other-host"
    answer, said = await mcp_exec(ssh_lab, "hijacked", f"touch {planted}")
    assert answer is None and "[unreachable]" in said and "ssh to hijacked failed" in said, said
    assert "host key" in said.lower() or "IDENTIFICATION" in said, said
    assert not planted.exists() and len(logins_of(other)) == before, "the coordinator's key logged in nowhere"

    answer, said = await mcp_exec(ssh_lab, "unlisted", f"touch {planted}")
    assert answer is None and "[no_login]" in said and "--ssh-logins" in said and "host_key" in said, said
    assert not planted.exists()
    answer, said = await mcp_exec(ssh_lab, "consoled", "echo on its console")
    assert answer is not None and (answer["channel"], answer["stdout"]) == ("console", "on its console\n"), said


def test_a_client_pins_the_host_keys_of_its_user_s_own_known_hosts(ssh_lab, tmp_path, monkeypatch):
    """A client trusts the exporter's pin only when its user names none: with
    $DEVICE_LOOP_SSH_KNOWN_HOSTS the user's own file decides, by device name."""
    sshd, leases = ssh_lab.sshd, ssh_lab.leases
    known = tmp_path / "known_hosts"
    known.write_text(f"vm {sshd.host_key}\nhijacked {sshd.host_key}\n")
    monkeypatch.setenv(KNOWN_HOSTS_ENV, str(known))
    assert leases["vm"].exec("true", identity_file=str(sshd.identity)).status == 0
    for name in ("hijacked", "unpinned"):  # another key than the user's pin; a device the file does not name
        with pytest.raises(ExecError) as refused:
            leases[name].exec("true", identity_file=str(sshd.identity))
        assert refused.value.code == "unreachable" and "Host key verification failed" in refused.value.message


def test_a_logins_file_is_checked_when_the_coordinator_starts(tmp_path):
    key, public = keypair(tmp_path / "key")
    good = {"user": "ci", "identity": "key", "host_key": public + " root@board"}
    path = tmp_path / "logins.toml"
    path.write_text(tomli_w.dumps({"devices": {"b0": good}, "hosts": {"host-a": {**good, "user": "root"}}}))
    logins = load_ssh_logins(path)
    assert logins.login_for("b0", "host-a") == SshLogin("ci", str(key), public.rsplit(" ", 1)[0])
    assert logins.login_for("b1", "host-a").user == "root" and logins.login_for("b1", "host-b") is None
    assert logins.login_for("b1", None) is None
    key.chmod(0o644)
    for data, says in [({"devices": {"b0": good}}, "chmod 600"),
                       ({"devices": {"b0": {**good, "identity": "nope"}}}, "cannot read"),
                       ({"devices": {"b0": {**good, "host_key": "not a key"}}}, "public key"),
                       ({"devices": {"b0": {**good, "user": "-oProxyCommand=x"}}}, "pattern"),
                       ({"devices": {"b0": {k: v for k, v in good.items() if k != "host_key"}}}, "required"),
                       ({"devices": {"b 0": good}}, "pattern"), ({"ssh": {}}, "not permitted")]:
        path.write_text(tomli_w.dumps(data))
        with pytest.raises(SshLoginsError, match=says):
            load_ssh_logins(path)
    path.write_text("[devices")
    with pytest.raises(SshLoginsError, match="not valid TOML"):
        load_ssh_logins(path)
