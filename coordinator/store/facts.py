"""SQL that several query modules share: a device with the facts its state follows from,
and what makes one free to lease."""
from __future__ import annotations

from device_loop.core import FLASH_KIND, LIVE_LEASE_STATES, LIVE_OP_STATES
from device_loop.core.needs import REAL_HW, VIRTUAL
from device_loop.core.vocabulary import Needs, OperationState, sql_list

LIVE_SQL = sql_list(LIVE_LEASE_STATES)
LIVE_OP_SQL = sql_list(LIVE_OP_STATES)
ENDED_OP_SQL = sql_list(s for s in OperationState if s not in LIVE_OP_STATES)

# A device with the facts its state follows from (rows.DeviceFacts): its live lease and its
# host, and the exclusive operation running on it (each at most one, by partial UNIQUE indexes).
LIVE_EXCLUSIVE = f"o.exclusive AND o.state IN {LIVE_OP_SQL}"
DEVICE_FACTS = (
    "SELECT d.*, l.id AS lease_id, l.state AS lease_state, l.holder AS holder, l.expires_at AS expires_at, "
    "h.online AS host_online, h.draining AS host_draining, o.id AS op_id, o.kind AS op_kind, "
    "o.progress_detail AS op_detail FROM devices d "
    f"LEFT JOIN leases l ON l.device = d.name AND l.state IN {LIVE_SQL} "
    "LEFT JOIN hosts h ON h.name = d.host "
    f"LEFT JOIN operations o ON o.device = d.name AND {LIVE_EXCLUSIVE}")

# A device a new lease may have: idle (so present, online, unleased, not being reclaimed,
# healthy), not needing recovery, no exclusive operation running, its host not drained.
FREE = ("d.state = 'idle' AND d.needs_recovery IS NULL AND d.fault IS NULL AND o.id IS NULL "
        "AND (h.draining IS NULL OR NOT h.draining)")

REAL_HW_SQL = sql_list(REAL_HW)
VIRTUAL_SQL = sql_list(VIRTUAL)


def needs_met(needs: str, fallback_at: str, fidelity: str) -> str:
    """SQL: a device whose fidelity is the expression ``fidelity`` is what a request whose
    ``needs`` and ``fallback_at`` are these expressions takes at ``:now`` (``core/needs.py``):
    any device without needs; a real one for ``real-hw``; a virtual one for ``any``, and a real
    one too once its fallback's time came (``fallback_at`` is NULL without a fallback)."""
    return (f"({needs} IS NULL OR ({needs} = '{Needs.REAL_HW}' AND {fidelity} IN {REAL_HW_SQL}) OR "
            f"({needs} = '{Needs.ANY}' AND ({fidelity} IN {VIRTUAL_SQL} OR {fallback_at} <= :now)))")


#: ORDER BY's first key where virtual devices go first (``needs = "any"``, "Who gets the next lease")
VIRTUAL_FIRST = f"CASE WHEN d.fidelity IN {VIRTUAL_SQL} THEN 0 ELSE 1 END"


#: ORDER BY's first key where devices already running image ``:running`` (a digest) go first
#: (docs/architecture.md, "Leases that live as long as their client"): the device's latest flash
#: that ended wrote that digest, completed, and read it back (``operations.verified``). A label, a
#: fingerprint, or a flash that cannot read back never counts.
RUNNING_FIRST = (
    "CASE WHEN EXISTS (SELECT 1 FROM operations f WHERE f.id = (SELECT g.id FROM operations g WHERE g.device = d.name "
    f"AND g.kind = '{FLASH_KIND}' AND g.state IN {ENDED_OP_SQL} ORDER BY g.created_at DESC, g.id DESC LIMIT 1) "
    f"AND f.state = '{OperationState.DONE}' AND f.verified AND f.image_sha256 = :running) THEN 0 ELSE 1 END")
