"""The trust mode says that it ignores tokens (a token made there, a client sending one, the
board's Tokens table), and `device-loop up --tokens` starts a lab that uses them: its admin
token printed, a scoped agent token held to its scope (docs/architecture.md, "Identity")."""
import re

import pytest

from conftest import wait_for
from device_loop.core import TOKEN_IGNORED_HEADER
from helpers import run_cli
from lab_in_process import FakeExporter, device, in_process_lab
from test_up_vms import start_up, stop_up

SITE = "http://127.0.0.1"


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_the_trust_mode_says_where_a_token_is_ignored(tmp_path):
    async with in_process_lab(tmp_path) as (client, rules, clock):  # (the trust mode of device-loop up)
        api = client("root")
        await FakeExporter(api, "host-a").beat([device("b0"), {**device("x0"), "class": "other"}])
        made = await api.post("/admin/tokens", json={"user": "bot-7", "kind": "agent", "scope": {"classes": ["other"]}})
        assert made.status_code == 201, made.text
        assert "ignores tokens" in made.json()["note"] and "device-loop up --tokens" in made.json()["note"]
        plain = await api.get("/whoami")
        assert TOKEN_IGNORED_HEADER not in plain.headers, "no token sent: nothing to say"
        bot = client(token=made.json()["token"])
        answer = await bot.post("/leases", json={"device": "b0"})  # outside its scope: the trust mode ignores it
        assert answer.status_code == 201 and "ignores tokens" not in answer.text
        assert "trust mode" in answer.headers[TOKEN_IGNORED_HEADER]
        board = (await client("root").get(f"{SITE}/")).text
        assert 'id="tokens-ignored"' in board and "bot-7" in board


@pytest.mark.anyio
@pytest.mark.usefixtures("database")
async def test_a_lab_with_tokens_says_nothing_of_the_kind(tmp_path):
    from device_loop.coordinator.identity import issue_token

    async with in_process_lab(tmp_path, single_user=False) as (client, rules, clock):
        root = client(token=(await issue_token(rules.store, clock, "root", admin=True))["token"])
        made = await root.post("/admin/tokens", json={"user": "bot-7", "kind": "agent"})
        assert made.status_code == 201 and "note" not in made.json()
        assert TOKEN_IGNORED_HEADER not in (await root.get("/whoami")).headers
        assert 'id="tokens-ignored"' not in (await root.get(f"{SITE}/")).text


@pytest.mark.service
@pytest.mark.timeout(120)
def test_up_with_tokens_prints_an_admin_token_and_holds_a_scoped_one_to_its_scope(tmp_path, env):
    bare = tmp_path / "bin"  # no Xvfb: no screens to start (test_up_and_client.py has them)
    bare.mkdir()
    proc, url, log = start_up(tmp_path, {**env, "PATH": str(bare)}, "--tokens", "--no-vms")
    try:
        banner = log.read_text()
        assert proc.poll() is None, banner
        assert "(with tokens: every caller needs one)" in banner, banner
        admin = re.search(r"admin token  (\S+)", banner)
        assert admin, banner
        assert (tmp_path / "lab" / "admin-token").stat().st_mode & 0o077 == 0, "only its owner reads it"
        nobody = run_cli(env, url, "reserve", "sim-board-0", check=False)
        assert nobody.returncode != 0 and "token" in nobody.stderr, nobody.stderr
        wrong = run_cli({**env, "DEVICE_LOOP_TOKEN": "dl_from-another-lab"}, url, "ls", check=False)
        assert wrong.returncode != 0 and "the token in $DEVICE_LOOP_TOKEN is not this lab's" in wrong.stderr \
            and "admin token create" in wrong.stderr, wrong.stderr
        root = {**env, "DEVICE_LOOP_TOKEN": admin.group(1)}
        assert "admin" in run_cli(root, url, "whoami").stdout
        wait_for(lambda: "idle" in run_cli(root, url, "ls").stdout, what="the boards idle")
        made = run_cli(root, url, "admin", "token", "create", "bot-7", "--kind", "agent", "--scope",
                       "class=sim-board", "--scope", "op=exec", "--budget", "120m/day")
        assert "note:" not in made.stdout, "a lab with tokens uses them"
        bot = {**env, "DEVICE_LOOP_TOKEN": made.stdout.splitlines()[1].strip()}
        assert "bot-7" in run_cli(bot, url, "whoami").stdout
        lease = run_cli(bot, url, "reserve", "sim-board-0", "--wait")
        assert "active" in lease.stdout
        flash = run_cli(bot, url, "flash", "sim-board-0", "sim-firmware-1.0", check=False)
        assert flash.returncode != 0 and "scope" in flash.stderr, flash.stderr
        stop_up(proc, tmp_path / "lab")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
