"""A shared worker (docs/architecture.md, "Jobs and evidence"): a job's processes cannot see
the worker's credentials or another job's, and none survives its job.

Each attack is a real job command: one walks ``/proc`` (its parents, then every process)
for a token or another lease's answer; one leaves a ``setsid`` child behind to read the next
person's lease. Both run under the accounts a shared worker maps its people to (uids with
no login name: root may use any)."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import WAIT_S, Coordinator, Exporter, Proc, lab_tokens, wait_for
from device_loop.client.accounts import parse_account
from device_loop.client.job_cgroups import FOLDER_PREFIX, CgroupsUnavailable, JobCgroups
from device_loop.client.local_run import LocalCommand
from device_loop.core.cgroups import Cgroup, own_cgroup
from helpers import device_loop_for_anyone, importable_by_anyone, open_folder, pid_alive, unused_uids, wait_state
from test_worker import SIM, make_tokens, worker
import zygote

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]

# Every environment this command's account can read: how many there are, how many hold a
# token, and how many hold a lease's answer other than its own lease's. First its parents,
# as the attack that found the admin's token did, then every process.
SCAN = textwrap.dedent("""\
    readable=0; tokens=0; leases=0
    p=$PPID; parents=""
    while [ "$p" -gt 1 ]; do parents="$parents $p"; p=$(awk '{print $4}' /proc/$p/stat 2>/dev/null || echo 1); done
    for f in $(for p in $parents; do echo /proc/$p/environ; done) /proc/[0-9]*/environ; do
        if e=$(tr '\\0' '\\n' < $f 2>/dev/null); then
            readable=$((readable + 1))
            case "$e" in *DEVICE_LOOP_TOKEN=*) tokens=$((tokens + 1));; esac
            if echo "$e" | grep '^DEVICE_LOOP_LEASE_ANSWER=' | grep -q -v -F "$DEVICE_LOOP_LEASE"; then
                leases=$((leases + 1))
            fi
        fi
    done
    for m in readable tokens leases; do eval "echo '{\\"metric\\": \\"'$m'\\", \\"value\\": '\\$$m'}'"; done
    echo "{\\"metric\\": \\"uid\\", \\"value\\": $(id -u)}"
    """)


def values(job: dict) -> dict[str, float]:
    return {s["metric"]: s["value"] for run in job["runs"] for s in run["samples"]}


def test_the_keeper_holds_nothing_of_the_workers_environment_and_says_when_it_watches(monkeypatch):
    """The keeper runs as the worker's account, so a command of that account (``run
    --from-job`` of another person's job) could read its environment: it gets no token."""
    monkeypatch.setenv("DEVICE_LOOP_TOKEN", "dl_not-for-the-keeper")
    cgroups = JobCgroups.start(print)
    try:
        environ = Path(f"/proc/{cgroups.keeper.pid}/environ").read_bytes().split(b"\0")
        assert not [v for v in environ if b"DEVICE_LOOP" in v or b"not-for-the-keeper" in v], environ
        assert cgroups.keeper.poll() is None, "it watches the lifeline"
    finally:
        cgroups.close()
    monkeypatch.setenv("PYTHONPATH", "/nowhere")  # (its interpreter then finds no device_loop: it never says ready)
    monkeypatch.setattr("device_loop.client.job_cgroups.sys.executable", shutil.which("python3") or "python3")
    with pytest.raises(CgroupsUnavailable, match="keeper .* did not start"):
        JobCgroups.start(print)


def test_a_command_and_all_it_started_die_when_it_ends_a_setsid_child_too(tmp_path):
    """In a cgroup, with cgroup.kill, and as a kernel without it (5.13 and before): pid by pid."""
    cgroups = JobCgroups.start(print)
    try:
        for use_kill_file in (True, False):
            cgroups.use_kill_file = use_kill_file
            job = cgroups.job()
            left = tmp_path / f"left-{use_kill_file}"
            result = LocalCommand(f"setsid sh -c 'echo $$ > {left}; exec sleep 300' & "
                                  f"while [ ! -s {left} ]; do sleep 0.01; done", os.environ, job=job).wait(10)
            assert result.status == 0, result.tail()
            assert not pid_alive(int(left.read_text())), "the setsid child died with its command"
            timed_out = LocalCommand("sleep 300 & sleep 300", os.environ, job=job).wait(0.2)
            assert timed_out.timed_out and not job.cgroup.populated(), "past its deadline: all of it killed"
            job.close()
            assert not job.cgroup.path.exists()
    finally:
        cgroups.close()
    assert not cgroups.folder.path.exists() and cgroups.keeper.returncode == 0
    with pytest.raises(CgroupsUnavailable, match="no cgroup v2"):
        JobCgroups.start(print, base=Cgroup(tmp_path))


def test_commands_under_two_accounts_cannot_read_each_others_environment(tmp_path):
    alice, bob = (parse_account(str(uid)) for uid in unused_uids(2))
    box = open_folder("dl-accounts-")
    cgroups = JobCgroups.start(print)
    try:
        job = cgroups.job()
        secret = f"alices-lease-{os.getpid()}"
        holder = LocalCommand(f"echo $$ > {box}/holder; exec sleep 60", {**alice.environment(os.environ),
                                                                          "LEASE_SECRET": secret},
                              job=job, account=alice)
        wait_for(lambda: (box / "holder").exists() and (box / "holder").read_text().strip(),
                 what="alice's command started")
        look = f"cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c {secret}; id -u"
        by_bob = LocalCommand(look, bob.environment(os.environ), job=job, account=bob).wait(10)
        by_alice = LocalCommand(look, alice.environment(os.environ), job=job, account=alice).wait(10)
        assert by_bob.stdout.split() == ["0", str(bob.uid)], "bob's command reads nothing of alice's"
        assert by_alice.stdout.split()[-1] == str(alice.uid) and int(by_alice.stdout.split()[0]) >= 1, \
            "the same look, under alice's own account, finds it: the look works"
        holder.kill()
        assert holder.wait(10).killed
        job.close()
    finally:
        cgroups.close()
        shutil.rmtree(box)


def test_the_worker_is_not_readable_by_its_own_accounts_children(tmp_path):
    """Non-dumpable: a worker's own child (same account, not root) reads neither its
    environment nor its memory; without it, it does."""
    uid = unused_uids(1)[0]
    box = open_folder("dl-private-")
    python, prologue = importable_by_anyone(box)
    (box / "worker.py").write_text(prologue + textwrap.dedent("""
        import subprocess
        from device_loop.core.process import keep_private
        if sys.argv[1] == "private":
            keep_private()
        look = "tr '\\\\0' '\\\\n' < /proc/$PPID/environ | grep -c WORKER_SECRET; head -c 1 /proc/$PPID/mem; echo $?"
        print(subprocess.run(["sh", "-c", look], capture_output=True, text=True).stdout)
    """))
    started: dict[str, subprocess.Popen] = {}
    try:
        for mode in ("plain", "private"):  # (side by side: a Python start each)
            started[mode] = subprocess.Popen([python, "-I", "-S", str(box / "worker.py"), mode], user=uid, group=uid,
                                             extra_groups=[], cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             text=True, env={"PATH": os.environ["PATH"], "USER": str(uid),
                                                             "WORKER_SECRET": "s3"})
        said = {mode: proc.communicate(timeout=WAIT_S) for mode, proc in started.items()}
        assert said["plain"][0].split()[0] == "1", said["plain"]
        assert said["private"][0].split() == ["0", "1"], said["private"]
    finally:
        for proc in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(box)


def test_a_starting_worker_removes_what_a_worker_killed_with_its_keeper_left(tmp_path):
    """In a cgroup of this test's own: other tests' workers sweep theirs meanwhile."""
    base = own_cgroup().child(f"device-loop-test-{os.getpid()}-{time.monotonic_ns()}")
    left = tmp_path / "left"
    script = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from device_loop.client.job_cgroups import JobCgroups
        from device_loop.client.local_run import LocalCommand
        from device_loop.core.cgroups import Cgroup
        cgroups = JobCgroups.start(print, base=Cgroup(Path({str(base.path)!r})))
        print("keeper", cgroups.keeper.pid, flush=True)
        LocalCommand("setsid sh -c 'echo $$ > {left}; exec sleep 300' & sleep 300", os.environ,
                     job=cgroups.job()).wait(300)
    """)
    dead = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        keeper = int(dead.stdout.readline().split()[1])
        child = int(wait_for(lambda: left.exists() and left.read_text().strip(), what="the setsid child"))
        os.kill(keeper, signal.SIGKILL)
        dead.kill()
        dead.wait()
        assert pid_alive(child), "with its keeper gone too, nothing killed it"
        assert [c.path.name.startswith(f"{FOLDER_PREFIX}{dead.pid}-") for c in base.children()] == [True]
        JobCgroups.start(print, base=base).close()
        wait_for(lambda: not pid_alive(child), what="the next worker killing what the gone one left")
        assert base.children() == []
    finally:
        if dead.poll() is None:
            dead.kill()
            dead.wait()
        base.remove()


def test_a_worker_will_not_serve_others_without_an_account_each(tmp_path, env):
    """Refused before it reaches the coordinator (there is none), run side by side: root's
    workers forked from the zygote, those of an account that is not root (which the zygote,
    root's, cannot fork) a Python start each."""
    uid = str(unused_uids(1)[0])
    env = {**env, "DEVICE_LOOP_COORDINATOR": "http://127.0.0.1:9", "DEVICE_LOOP_TOKEN": "dl_unused"}
    box = open_folder("dl-refusals-")
    # not root (below): it may not switch accounts, and has no cgroup it may use
    as_user = {"user": int(uid), "group": int(uid), "extra_groups": [], "cwd": "/", "env": {**env, "USER": uid}}
    try:
        not_root = [str(device_loop_for_anyone(box)), "worker"]
        refusals = {
            ("--users", "alice,bob", "--account", f"alice={uid}"): "no account for bob",
            ("--users", "alice", "--account", "alice=0"): "root's",
            ("--users", "alice", "--account", f"alice={uid}:0"): "in root's group",
            ("--users", "alice,bob", "--account", f"alice={uid}", "--account", f"bob={uid}:{uid}"): "same account",
            ("--users", "alice", "--account", f"alice={uid}", "--account", f"carol={uid}"): "carol is not one of",
            ("--users", "alice", "--account", "alice=nobody-here-at-all"): "no account 'nobody-here-at-all'",
            ("--account", f"alice={uid}"): "--account is for a worker that serves others",
            ("not root", "--users", "alice", "--account", f"alice={int(uid) + 1}"): "CAP_SETUID",
        }
        started, errors = {}, {args: tmp_path / f"refusal-{n}.err" for n, args in enumerate(refusals)}
        for args in refusals:
            with open(errors[args], "wb") as stderr:
                started[args] = (subprocess.Popen([*not_root, *args[1:]], stderr=stderr, **as_user)
                                 if args[0] == "not root" else
                                 zygote.popen(["worker", "--once", *args], env, stderr=stderr.fileno()))
        own = subprocess.Popen([*not_root, "--once"], stderr=subprocess.PIPE, text=True, **as_user)
        try:
            warned = own.stderr.readline()
            assert "warning: cannot make a cgroup" in warned and "setsid" in warned, warned
        finally:
            own.kill()
            own.wait()
        for args, said in refusals.items():
            code, stderr = started[args].wait(WAIT_S), errors[args].read_text()
            assert code == 2 and said in stderr, (args, stderr)
    finally:
        shutil.rmtree(box)


@pytest.mark.anyio
async def test_a_shared_workers_jobs_see_no_credential_but_their_own_and_leave_nothing(tmp_path, env):
    """alice's job walks /proc for the admin's token and leaves a setsid reader for bob's lease;
    bob's job, after it, walks /proc too. Each runs as its own account."""
    alice_uid, bob_uid = unused_uids(2)
    box = open_folder("dl-shared-")
    coordinator = Coordinator(tmp_path, env, extra=())
    tokens = await asyncio.to_thread(make_tokens, tmp_path, alice="person", bob="person", ops="admin")
    _, token_file = await asyncio.to_thread(lab_tokens, env, coordinator, tmp_path)
    exporter = Exporter(tmp_path, env, coordinator.url, [{"name": "sim-board-0", **SIM}], token_file=str(token_file))
    running: Proc | None = None
    try:
        await asyncio.to_thread(wait_state, coordinator, "sim-board-0", "idle")
        # (what it saw is there, if only empty, once it says it runs: it may be killed before it read once)
        reader = (f"setsid sh -c ': >> {box}/seen; echo $$ > {box}/left; "
                  f"while :; do cat /proc/[0-9]*/environ 2>/dev/null | "
                  f"tr \"\\0\" \"\\n\" | grep ^DEVICE_LOOP_LEASE_ANSWER= >> {box}/seen; sleep 0.05; done' & "
                  f"while [ ! -s {box}/left ]; do sleep 0.01; done")
        exec_ = f"{device_loop_for_anyone(box)} exec $DEVICE_LOOP_LEASE -- run-workload --cost 0.1"
        jobs = {}
        for user, commands in (("alice", [reader, SCAN]), ("bob", [SCAN, exec_])):
            jobs[user] = coordinator.api("/jobs", "POST", headers={"Authorization": f"Bearer {tokens[user]}"},
                                         json={"spec": {"target": {"device": "sim-board-0"}, "run": commands}}).json()
            assert jobs[user]["state"] == "queued", jobs[user]
        running = worker(tmp_path, {k: v for k, v in env.items() if k != "DEVICE_LOOP_TOKEN"}, coordinator,
                         "--users", "alice,bob", "--account", f"alice={alice_uid}", "--account", f"bob={bob_uid}",
                         token=tokens["ops"])
        ended = {}
        for user, job in jobs.items():
            ended[user] = await asyncio.to_thread(
                wait_for, lambda job=job: (j := coordinator.api(
                    f"/jobs/{job['id']}", params={"wait": 5, "unless": "running"},
                    headers={"Authorization": f"Bearer {tokens['ops']}"}).json())["state"] not in ("queued", "running")
                and j, interval=0.05, what=f"{user}'s job")
            assert ended[user]["state"] == "done", (ended[user]["reason"], running.output()[-3000:])
        left = int((box / "left").read_text())
        assert not pid_alive(left), "alice's setsid reader died with her job, before bob's began"
        for user, uid in (("alice", alice_uid), ("bob", bob_uid)):
            found = values(ended[user])
            assert found["uid"] == uid, f"{user}'s commands ran as {user}'s account"
            assert found["readable"] >= 1, "the scan read its own environment: it can see what there is"
            assert (found["tokens"], found["leases"]) == (0, 0), f"{user}'s job found another's credential: {found}"
        bobs_lease = ended["bob"]["cells"][0]["lease_id"]
        assert bobs_lease and bobs_lease not in (box / "seen").read_text(errors="replace")
        assert f"alice's as {alice_uid}" in running.output()
        assert running.stop() == 0, running.output()[-3000:]
        assert not any(c.path.name.startswith(f"{FOLDER_PREFIX}{running.popen.pid}-")
                       for c in own_cgroup().children()), "the worker removed its cgroups as it stopped"
    finally:
        if running is not None:
            running.stop(signal.SIGKILL)
        if (box / "left").exists() and pid_alive(int((box / "left").read_text())):  # (a failure's leftover)
            os.kill(int((box / "left").read_text()), signal.SIGKILL)
        exporter.stop()
        coordinator.stop()
        shutil.rmtree(box, ignore_errors=True)


def test_running_another_persons_job_shows_its_commands_asks_first_and_keeps_the_readers_token(tmp_path, env):
    """``run --from-job``, as the evidence advertises it, by an admin: alice's commands are
    shown (escapes shown as escapes) and need a yes; they never get the admin's token unless
    told (--share-token)."""
    coordinator = Coordinator(tmp_path, env, extra=())
    tokens = make_tokens(tmp_path, alice="person", ops="admin")
    _, token_file = lab_tokens(env, coordinator, tmp_path)
    exporter = Exporter(tmp_path, env, coordinator.url, [{"name": "sim-board-0", **SIM}], token_file=str(token_file))
    try:
        wait_state(coordinator, "sim-board-0", "idle")
        hidden = "echo looks harmless\r\x1b[2Kecho"
        said = ('[ -n "$DEVICE_LOOP_TOKEN" ] && t=1 || t=0; '
                'echo "{\\"metric\\": \\"token_given\\", \\"value\\": $t}"')
        alices = coordinator.api("/jobs", "POST", headers={"Authorization": f"Bearer {tokens['alice']}"},
                                 json={"spec": {"target": {"device": "sim-board-0"}, "setup": [hidden],
                                                "run": [said]}}).json()
        ops = {**env, "DEVICE_LOOP_COORDINATOR": coordinator.url, "DEVICE_LOOP_TOKEN": tokens["ops"]}

        def rerun(*args: str, stdin: int | None = None) -> subprocess.CompletedProcess:
            """``device-loop run --from-job`` of alice's job, its standard input ``stdin`` (None: /dev/null)."""
            out, err = tmp_path / "rerun.out", tmp_path / "rerun.err"
            with open(out, "wb") as stdout, open(err, "wb") as stderr:
                ran = zygote.popen(["run", "--from-job", alices["id"], "--json", *args], ops, stdin=stdin,
                                   stdout=stdout.fileno(), stderr=stderr.fileno())
            code = ran.wait(WAIT_S)
            return subprocess.CompletedProcess(ran.args, code, out.read_text(), err.read_text())

        def ops_jobs() -> list[dict]:
            return coordinator.api("/jobs", headers={"Authorization": f"Bearer {tokens['ops']}"}).json()

        refused = rerun()
        assert refused.returncode == 1 and f"{alices['id']} is alice's job" in refused.stderr, refused.stderr
        assert "echo looks harmless\\r\\x1b[2Kecho" in refused.stderr and "\x1b" not in refused.stderr
        assert said in refused.stderr and "--yes" in refused.stderr
        primary, secondary = os.openpty()
        try:
            os.write(primary, b"n\n")
            declined = rerun(stdin=secondary)
        finally:
            os.close(primary)
            os.close(secondary)
        assert declined.returncode == 1 and "Run them?" in declined.stderr and "not run" in declined.stderr
        assert ops_jobs() == [], "nothing ran"

        for args, given in ((["--yes"], 0), (["--yes", "--share-token"], 1)):
            ran = rerun(*args)
            assert ran.returncode == 0, ran.stderr[-3000:]
            runs = json.loads(ran.stdout)["runs"]
            assert [s["value"] for s in runs[0]["samples"]] == [given], (args, runs)
    finally:
        exporter.stop()
        coordinator.stop()
