"""The Unix accounts a shared worker runs its users' commands under (docs/architecture.md,
"Jobs and evidence").

A worker that serves others (``device-loop worker --users alice,bob``) runs each person's
commands under that person's own account, named by ``--account alice=ACCOUNT`` (a login
name, or ``UID[:GID]``). Each served person needs one, and two people never share one,
nor the worker's own account or root's: a job's processes then cannot read or signal the
worker, its keeper (``client/job_cgroups.py``) or another person's job.
"""
from __future__ import annotations

import os
import pwd
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

CAP_SETGID, CAP_SETUID = 6, 7  # linux/capability.h
#: What a command under another account keeps of the worker's environment (the rest may be
#: the worker's own business: its token, a cloud credential, its folders).
KEPT_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM")


class AccountError(ValueError):
    """An account mapping this worker will not use, and why."""


@dataclass(frozen=True)
class Account:
    """A Unix account commands run as."""
    name: str                  # its login name, or its uid where it has none
    uid: int
    gid: int
    groups: tuple[int, ...]    # its supplementary groups (none where it has no login name)
    home: str
    shell: str

    @property
    def workdir(self) -> str:
        """Where its commands start: its home, or ``/`` where it has none."""
        return self.home if Path(self.home).is_dir() else "/"

    def environment(self, worker_env: Mapping[str, str]) -> dict[str, str]:
        """What a command under this account starts from: the worker's ``PATH``, locale,
        ``TZ`` and ``TERM``, and its own ``HOME``, ``USER``, ``LOGNAME`` and ``SHELL``."""
        kept = {k: v for k, v in worker_env.items() if k in KEPT_ENV or k.startswith("LC_")}
        return {**kept, "HOME": self.home, "USER": self.name, "LOGNAME": self.name, "SHELL": self.shell}


def parse_account(text: str) -> Account:
    """An account from a login name or ``UID[:GID]`` (an account without a login name has
    no supplementary groups, its home is ``/``); ``AccountError`` if there is none such."""
    first, sep, second = text.partition(":")
    if first.isdigit() and (not sep or second.isdigit()):
        uid = int(first)
        try:
            entry: pwd.struct_passwd | None = pwd.getpwuid(uid)
        except KeyError:
            entry = None
        gid = int(second) if sep else (entry.pw_gid if entry else uid)
        if entry is None:
            return Account(name=str(uid), uid=uid, gid=gid, groups=(), home="/", shell="/bin/sh")
        return Account(name=entry.pw_name, uid=uid, gid=gid, groups=_groups(entry.pw_name, gid),
                       home=entry.pw_dir, shell=entry.pw_shell or "/bin/sh")
    if sep:
        raise AccountError(f"{text!r} is not an account: give a login name or UID[:GID]")
    try:
        entry = pwd.getpwnam(text)
    except KeyError:
        raise AccountError(f"there is no account {text!r} on this machine") from None
    return Account(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid, groups=_groups(entry.pw_name, entry.pw_gid),
                   home=entry.pw_dir, shell=entry.pw_shell or "/bin/sh")


def _groups(name: str, gid: int) -> tuple[int, ...]:
    return tuple(sorted(set(os.getgrouplist(name, gid))))


def account_map(users: Iterable[str], given: Iterable[str]) -> dict[str, Account]:
    """The account of each served user, from ``--account USER=ACCOUNT`` options; an
    ``AccountError`` saying what is missing or not allowed."""
    users = list(users)
    accounts: dict[str, Account] = {}
    for option in given:
        user, sep, named = option.partition("=")
        if not sep or not user or not named:
            raise AccountError(f"--account takes USER=ACCOUNT (a login name or UID[:GID]), not {option!r}")
        if user not in users:
            raise AccountError(f"--account {option}: {user} is not one of the --users this worker serves")
        if user in accounts:
            raise AccountError(f"--account names {user}'s account twice")
        accounts[user] = parse_account(named)
    missing = [u for u in users if u not in accounts]
    if missing:
        raise AccountError(f"no account for {', '.join(missing)}: a worker that serves others runs each one's "
                           "commands under their own Unix account; give --account USER=ACCOUNT (a login name "
                           "or UID[:GID]) for each")
    own, own_group = os.geteuid(), os.getegid()
    for user, account in accounts.items():
        if account.uid in (0, own):
            raise AccountError(f"{user}'s account {account.name} is {'root' if account.uid == 0 else 'this worker'}"
                               "'s: their commands could then reach the worker and other people's jobs")
        shared = sorted({0, own_group} & {account.gid, *account.groups})
        if shared:
            whose = "root's group" if shared[0] == 0 else f"this worker's group ({own_group})"
            raise AccountError(f"{user}'s account {account.name} is in {whose}: their commands could read what "
                               "that group may (give the account a group of its own)")
        others = [u for u, a in accounts.items() if u != user and a.uid == account.uid]
        if others:
            raise AccountError(f"{user} and {others[0]} have the same account ({account.name}): each person "
                               "needs their own")
    return accounts


def can_switch_accounts() -> bool:
    """Whether this process may run commands as another account (root, or CAP_SETUID and
    CAP_SETGID)."""
    if os.geteuid() == 0:
        return True
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return False
    effective = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("CapEff:")), 0)
    return bool(effective >> CAP_SETUID & 1 and effective >> CAP_SETGID & 1)
