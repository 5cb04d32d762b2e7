"""SQL that several query modules share: a device with the facts its state follows from,
and what makes one free to lease."""
from __future__ import annotations

from device_loop.core import LIVE_LEASE_STATES, LIVE_OP_STATES
from device_loop.core.vocabulary import sql_list

LIVE_SQL = sql_list(LIVE_LEASE_STATES)
LIVE_OP_SQL = sql_list(LIVE_OP_STATES)

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
