"""exec over the ``ssh`` kind (plugins/ssh): Debian's sshd on a loopback port with a throwaway
host key, relayed by a real exporter behind the lease gate of a lab with tokens; the host key
pinned from the exporter's config, the client's key given with --identity."""
import getpass
import json
import os
import subprocess

import pytest

from conftest import Coordinator, Exporter, lab_tokens, wait_for
from device_loop.client.lab import Lab
from device_loop.core.device_exec import ExecError
from device_loop.core.ports import free_port, port_is_free
from device_loop.plugins.ssh import SshConfig
from test_end_to_end import run_cli, wait_state
from test_exec_console import environment

pytestmark = pytest.mark.timeout(90)
SSHD = "/usr/sbin/sshd"


def keypair(path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test", "-f", str(path)], check=True,
                   timeout=30)
    return path, path.with_suffix(".pub").read_text().strip()


class Sshd:
    """sshd in the foreground on a free loopback port, as whoever runs the tests: a host key,
    the authorized key and its pid file in ``folder``."""

    def __init__(self, folder):
        folder.mkdir()
        self.host_key_file, self.host_key = keypair(folder / "host_key")
        self.identity, authorized = keypair(folder / "id_alice")
        (folder / "authorized_keys").write_text(authorized + "\n")
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
        wait_for(lambda: self.proc.poll() is not None or not port_is_free("127.0.0.1", self.port), 10,
                 what="sshd listening")
        assert self.proc.poll() is None, self.log.read_text()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def ssh_lab(tmp_path_factory):
    """(sshd, alice's Lab, her environment, the coordinator, leases): ``vm`` with the board's host
    key pinned, ``impostor`` pinned to another key, ``unpinned`` without one (one lab for the module)."""
    tmp_path = tmp_path_factory.mktemp("ssh-lab")
    env = environment(tmp_path)
    sshd = Sshd(tmp_path / "sshd")
    _, other_key = keypair(tmp_path / "other_host_key")
    coordinator = Coordinator(tmp_path, env, extra=())
    tokens, token_file = lab_tokens(env, coordinator, tmp_path, "alice")
    board = {"plugin": "ssh", "port": sshd.port, "user": sshd.user}
    devices = [{"name": "vm", "class": "vm", "resources": [{**board, "host_key": sshd.host_key + " root@board"}]},
               {"name": "impostor", "class": "vm", "resources": [{**board, "host_key": other_key}]},
               {"name": "unpinned", "class": "vm", "resources": [board]}]
    exporter = Exporter(tmp_path, env, coordinator.url, devices, token_file=str(token_file))
    lab = Lab(coordinator.url, token=tokens["alice"])
    try:
        for name in ("vm", "impostor", "unpinned"):
            wait_state(coordinator, name, "idle")
        leases = {name: lab.reserve(name).wait_ready() for name in ("vm", "impostor", "unpinned")}
        yield sshd, lab, {**env, "DEVICE_LOOP_TOKEN": tokens["alice"]}, coordinator, leases
    finally:
        lab.api.close()
        exporter.stop()
        coordinator.stop()
        sshd.stop()


def test_exec_over_ssh_with_the_host_key_pinned(ssh_lab):
    sshd, lab, alice, coordinator, leases = ssh_lab
    lease = leases["vm"]
    (endpoint,) = lease.endpoints
    assert (endpoint["kind"], endpoint["role"], endpoint["protocol"]) == ("ssh", "ssh", "ssh")
    assert endpoint["params"] == {"user": sshd.user, "host_key": sshd.host_key.rsplit(" ", 1)[0]}, \
        "the key as the exporter's config pins it, without its comment"
    assert lease.data["secret"] and any(c.startswith("ssh -p ") for c in lease.data["commands"])
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
    sshd, lab, alice, coordinator, leases = ssh_lab
    lease = leases["vm"]
    cut = lease.exec("head -c 200000 /dev/zero | tr '\\0' x; echo done >&2", identity_file=str(sshd.identity),
                     max_output=1000)
    assert cut.truncated and cut.stdout == "x" * 1000 and cut.stderr.startswith("done\n")
    assert "stdout cut at 1000 bytes" in cut.stderr
    with pytest.raises(ExecError) as timed_out:
        lease.exec("sleep 30", timeout_s=1, identity_file=str(sshd.identity))
    assert timed_out.value.code == "timeout"


def test_the_cli_over_ssh(ssh_lab):
    sshd, lab, alice, coordinator, leases = ssh_lab
    url = coordinator.url
    done = run_cli(alice, url, "exec", "vm", "--identity", str(sshd.identity), "--", "echo out; echo err >&2; exit 5",
                   check=False)
    assert (done.returncode, done.stdout, done.stderr) == (5, "out\n", "err\n")
    keyed = {**alice, "DEVICE_LOOP_SSH_IDENTITY": str(sshd.identity)}
    answer = json.loads(run_cli(keyed, url, "exec", "vm", "--json", "--", "echo", "hi").stdout)
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
        lease = {"id": "lease-x", "device": "b0", "ready": True, "secret": None, "endpoints": [
            {"kind": "ssh", "role": "ssh", "host": "127.0.0.1", "port": free_port(), "params": {"user": user}}]}
        with pytest.raises(ExecError) as refused:
            exec_on_lease(lease, "true", 5)
        assert refused.value.code == "unreachable" and "not a login name" in refused.value.message
    assert not planted.exists()
