"""Who else holds a device node (``busy_by``), as admins see it: the program and its pid,
its cgroup and the command line, with what looks like a secret in it replaced by
``[redacted]`` (anyone else sees only how many: they may be other people's processes). The
command line is what an exporter read from /proc, or what a stolen exporter token says:
data, and as public as a ``--password=`` argument.

What looks like a secret (``redact``), word by word:

- the value of a name that sounds like one, as ``NAME=value`` (``--password=x``,
  ``DB_PASSWORD=x``) or as an option and the next word (``--token x``, ``-p x``, ``-px``,
  ``Authorization: Bearer x``). A name sounds like one when it holds ``SECRET_WORDS`` or
  one of its parts (split at ``-``, ``_``, ``.``) is one of ``SECRET_PARTS``;
- the password of a URL (``https://user:x@host``);
- a random-looking string: 20 characters or more of letters, digits, ``+ = _ -`` that are
  hexadecimal with digits and letters (a digest, a key), or that mix upper and lower case
  and digits as random text does (the kind of character changes between at least 30% of
  neighbours: ``dl_Q2x9vT7...``, but not ``usb-FTDI_FT232R_USB_UART_A50285BI-if00-port0``).
"""
from __future__ import annotations

import posixpath
import re
from typing import Any, Mapping, cast

from device_loop.core.answers import HolderAnswer

REDACTED = "[redacted]"
SECRET_WORDS = ("password", "passwd", "passphrase", "secret", "token", "apikey", "credential", "auth", "cookie",
                "session", "private")
SECRET_PARTS = {"pass", "pw", "pwd", "key", "pin", "api"}
SECRET_FLAGS = {"-p"}  # a short option whose value is a password (mysql, sshpass)
SCHEMES = {"bearer", "basic", "digest", "token"}  # between "Authorization:" and its credential
MAX_PROGRAM_CHARS = 64
_URL_PASSWORD = re.compile(r"(://[^/\s:@]*):[^/\s@]*@")
_RUN = re.compile(r"[A-Za-z0-9+=_-]{20,}")


def holder_json(holder: Mapping[str, Any], in_full: bool = False) -> HolderAnswer:
    """A process holding a device node: ``pid`` and ``program`` (what an admin's reason names),
    and ``in_full`` ``command`` and ``cgroup`` (a container's names its container)."""
    command = redact(str(holder.get("command", "")))
    program = posixpath.basename(command.split(" ", 1)[0])[:MAX_PROGRAM_CHARS] or "?"
    # (a report's holders all have a pid: core.protocol.Holder)
    answer: HolderAnswer = {"pid": cast(int, holder.get("pid")), "program": program}
    if in_full:
        answer["command"] = command
        answer["cgroup"] = str(holder.get("cgroup", ""))
    return answer


def redact(command: str) -> str:
    """``command`` with what looks like a secret replaced by ``[redacted]`` (the rules above)."""
    words, hide_next = re.split(r"(\s+)", command), False
    for n, word in enumerate(words):
        if not word or word.isspace():
            continue
        if hide_next and word.lower() in SCHEMES:
            continue  # "Bearer": the credential is the next word
        if hide_next and not word.startswith("-"):
            words[n], hide_next = REDACTED, False
            continue
        hide_next = False
        name, equals, value = word.partition("=")
        if equals and _sounds_secret(name):
            words[n] = f"{name}={REDACTED}"
        elif word in SECRET_FLAGS or (word.startswith("-") or word.endswith(":")) and _sounds_secret(word):
            hide_next = True
        elif word.startswith("-p") and not word.startswith("--") and len(word) > 2:
            words[n] = "-p" + REDACTED
        else:
            words[n] = name + equals + _redact_value(value) if equals else _redact_value(word)
    return "".join(words)


def _sounds_secret(name: str) -> bool:
    bare = name.lstrip("-").rstrip(":").lower()
    return any(word in bare for word in SECRET_WORDS) or bool(SECRET_PARTS & set(re.split(r"[-_.]", bare)))


def _redact_value(text: str) -> str:
    text = _URL_PASSWORD.sub(rf"\1:{REDACTED}@", text)
    return _RUN.sub(lambda run: REDACTED if _looks_random(run.group(0)) else run.group(0), text)


def _kind(char: str) -> str:
    return "digit" if char.isdigit() else "upper" if char.isupper() else "lower" if char.islower() else ""


def _looks_random(run: str) -> bool:
    kinds = [_kind(c) for c in run]
    present = set(kinds) - {""}
    if re.fullmatch(r"[0-9a-fA-F]+", run):
        return "digit" in present and len(present) >= 2
    pairs = [(a, b) for a, b in zip(kinds, kinds[1:]) if a and b]
    changes = sum(a != b for a, b in pairs) / max(len(pairs), 1)
    return len(present) >= 2 and changes >= 0.3
