"""What an ssh login to a board names: a login name, and the board's public host key as a lab
admin copies it from the board's ``/etc/ssh/ssh_host_ed25519_key.pub`` (``ssh-ed25519 AAAA...
root@board``), checked and kept without its comment. The ssh plugin's config, the
coordinator's own ssh logins and ``device_exec`` (of what an exporter reports) take them."""
from __future__ import annotations

import re

#: What a user to log in as may be: a login name, never an option of ssh (``-oProxyCommand=...``)
LOGIN_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$"
#: The host key types OpenSSH offers (DSA is gone from it)
HOST_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                  "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com", "ssh-rsa")
_KEY = re.compile(r"^(\S+) ([A-Za-z0-9+/]+={0,2})(?: .*)?$")
#: The longest key an endpoint's param carries for a client to pin (core/protocol.py's ParamValue)
MAX_PINNED_KEY_CHARS = 255


def public_host_key(text: str) -> str:
    """``text``, a public key as a ``.pub`` file has it, as ``TYPE BASE64`` (its comment left
    out); ``ValueError`` saying what is wrong if it is not one."""
    match = _KEY.match(text.strip())
    if not match or match.group(1) not in HOST_KEY_TYPES:
        raise ValueError(f"host_key must be a public key as a .pub file has it ({HOST_KEY_TYPES[0]} AAAA...), "
                         f"not {text[:60]!r}")
    return f"{match.group(1)} {match.group(2)}"


def pinned_host_key(text: str) -> str:
    """``public_host_key(text)``, which an endpoint carries for its clients to pin: refused
    (``ValueError``) past the ``MAX_PINNED_KEY_CHARS`` an endpoint's param holds."""
    bare = public_host_key(text)
    if len(bare) > MAX_PINNED_KEY_CHARS:
        raise ValueError(f"a host key of {len(bare)} characters is more than an endpoint carries "
                         f"({MAX_PINNED_KEY_CHARS}): give the ed25519 or ecdsa key")
    return bare
