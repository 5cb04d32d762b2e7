"""Versioned schema migrations, applied in order at start-up.

Plain SQL valid on SQLite and PostgreSQL; the one difference (auto-increment keys) is
the ``{serial}`` placeholder. Where the two cannot share a statement (SQLite changes a
table's constraints only by rebuilding it), a step is a dict of the statement for each
dialect; a dialect it does not name skips it.
"""

SERIAL = {
    "sqlite": "INTEGER PRIMARY KEY AUTOINCREMENT",
    "postgresql": "BIGSERIAL PRIMARY KEY",
}


def _one_of(column: str, values: tuple[str, ...]) -> str:
    """``CHECK`` that ``column`` is one of ``values``, as comparisons: SQLite 3.40 builds an
    ``IN`` list's lookup table anew for every row it checks, which made the upsert of a
    1000-device heartbeat 3-7x slower; ``=`` with ``OR`` costs nothing measurable."""
    return "CHECK (" + " OR ".join(f"{column} = '{value}'" for value in values) + ")"


DEVICE_STATES = ("unregistered", "idle", "allocating", "in_use", "reclaiming", "faulty", "offline", "retired")
HEALTH_STATES = ("ok", "degraded", "failed")
LEASE_STATES = ("pending", "active", "released", "expired", "failed", "revoked")
OPERATION_STATES = ("queued", "running", "done", "failed")
TICKET_STATES = ("waiting", "granted", "claimed", "cancelled", "expired")
TICKET_KINDS = ("interactive", "batch")
TOKEN_KINDS = ("person", "agent")
BANDS = ("urgent", "normal", "background")
JOB_STATES = ("queued", "running", "done", "failed", "cancelled")
RUN_ARMS = ("A", "B", "run")
FAULT_KINDS = ("step-failed", "health-permanent", "marked-faulty", "switched-off", "unverified-on", "lab-failures")
FIDELITIES = ("hardware", "simulated", "virtual", "emulated")
PURPOSES = ("lease", "step", "settle", "recovery")
NEEDS = ("real-hw", "any")
FAILURE_KINDS = ("test", "lab", "timeout")

MIGRATIONS: list[list[str | dict[str, str]]] = [
    # 1: devices, resources, hosts, leases, logs, idempotency keys
    [
        """CREATE TABLE hosts (
            name TEXT PRIMARY KEY,
            boot_id TEXT NOT NULL,
            generation BIGINT NOT NULL,
            protocol INTEGER NOT NULL,
            version TEXT NOT NULL,
            heartbeat_s DOUBLE PRECISION NOT NULL,
            plugins TEXT NOT NULL,
            services TEXT NOT NULL,
            superseded_boots TEXT NOT NULL,
            last_seen DOUBLE PRECISION NOT NULL,
            online BOOLEAN NOT NULL
        )""",
        """CREATE TABLE devices (
            name TEXT PRIMARY KEY,
            class TEXT NOT NULL,
            tags TEXT NOT NULL,
            host TEXT,
            state TEXT NOT NULL,
            present BOOLEAN NOT NULL,
            health TEXT NOT NULL,
            health_reason TEXT NOT NULL,
            conflict_host TEXT,
            reclaim_lease TEXT,
            busy_by TEXT NOT NULL,
            retired BOOLEAN NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL
        )""",
        """CREATE TABLE resources (
            identifier TEXT PRIMARY KEY,
            device TEXT NOT NULL REFERENCES devices(name),
            kind TEXT NOT NULL,
            plugin TEXT NOT NULL,
            health TEXT NOT NULL,
            reason TEXT NOT NULL
        )""",
        "CREATE INDEX resources_device ON resources(device)",
        """CREATE TABLE leases (
            id TEXT PRIMARY KEY,
            device TEXT NOT NULL REFERENCES devices(name),
            holder TEXT NOT NULL,
            state TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL,
            ended_at DOUBLE PRECISION,
            end_reason TEXT
        )""",
        # Exclusivity lives here, in the database, so several coordinators stay correct.
        "CREATE UNIQUE INDEX leases_one_live_per_device ON leases(device) WHERE state IN ('pending', 'active')",
        "CREATE INDEX leases_holder ON leases(holder, state)",
        """CREATE TABLE device_log (
            id {serial},
            device TEXT NOT NULL,
            at DOUBLE PRECISION NOT NULL,
            from_state TEXT NOT NULL,
            to_state TEXT NOT NULL,
            cause TEXT NOT NULL,
            actor TEXT NOT NULL
        )""",
        "CREATE INDEX device_log_device ON device_log(device, id)",
        """CREATE TABLE audit (
            id {serial},
            at DOUBLE PRECISION NOT NULL,
            actor TEXT NOT NULL,
            action TEXT NOT NULL,
            device TEXT,
            lease_id TEXT,
            detail TEXT NOT NULL
        )""",
        """CREATE TABLE idempotency (
            caller TEXT NOT NULL,
            key TEXT NOT NULL,
            request TEXT NOT NULL,
            status INTEGER,
            body TEXT,
            created_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (caller, key)
        )""",
    ],
    # 2: API tokens (docs/architecture.md, "Identity"): stored hashed; exporter tokens are
    # bound to one host
    [
        """CREATE TABLE tokens (
            id TEXT PRIMARY KEY,
            hash TEXT NOT NULL UNIQUE,
            username TEXT NOT NULL,
            admin BOOLEAN NOT NULL,
            host TEXT,
            created_at DOUBLE PRECISION NOT NULL,
            expires_at DOUBLE PRECISION,
            revoked_at DOUBLE PRECISION
        )""",
    ],
    # 3: admins drain hosts: no new leases there
    ["ALTER TABLE hosts ADD COLUMN draining BOOLEAN NOT NULL DEFAULT FALSE"],
    # 4: each lease's secret, which its gated endpoints ask for (NULL where the gate is off)
    ["ALTER TABLE leases ADD COLUMN secret TEXT"],
    # 5: network-discovered candidates, and the names admins adopted them under
    [
        """CREATE TABLE candidates (
            identifier TEXT PRIMARY KEY,
            host TEXT NOT NULL,
            kind TEXT NOT NULL,
            plugin TEXT NOT NULL,
            label TEXT NOT NULL,
            last_seen DOUBLE PRECISION NOT NULL
        )""",
        """CREATE TABLE adoptions (
            identifier TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            class TEXT NOT NULL,
            tags TEXT NOT NULL,
            host TEXT NOT NULL,
            adopted_by TEXT NOT NULL,
            at DOUBLE PRECISION NOT NULL
        )""",
    ],
    # 6: heartbeats write only what changed: each device keeps the digest of its last
    # report and its resources' health; the ring log is 20 slots per device, one upsert a
    # change. The resources table keeps identity only (which device owns an identifier).
    # Devices get their resources back at their host's next heartbeat.
    [
        "ALTER TABLE devices ADD COLUMN resources TEXT NOT NULL DEFAULT '[]'",
        "ALTER TABLE devices ADD COLUMN report_digest TEXT",
        "ALTER TABLE devices ADD COLUMN log_seq BIGINT NOT NULL DEFAULT 0",
        "CREATE INDEX devices_host ON devices(host)",
        "CREATE INDEX devices_conflict_host ON devices(conflict_host)",
        "CREATE INDEX idempotency_created_at ON idempotency(created_at)",
        "ALTER TABLE resources DROP COLUMN health",
        "ALTER TABLE resources DROP COLUMN reason",
        "ALTER TABLE hosts ADD COLUMN devices_digest TEXT",
        """CREATE TABLE device_ring (
            device TEXT NOT NULL,
            slot INTEGER NOT NULL,
            seq BIGINT NOT NULL,
            at DOUBLE PRECISION NOT NULL,
            from_state TEXT NOT NULL,
            to_state TEXT NOT NULL,
            cause TEXT NOT NULL,
            actor TEXT NOT NULL,
            PRIMARY KEY (device, slot)
        )""",
        """INSERT INTO device_ring (device, slot, seq, at, from_state, to_state, cause, actor)
           SELECT device, seq % {ring}, seq, at, from_state, to_state, cause, actor FROM
           (SELECT l.*, ROW_NUMBER() OVER (PARTITION BY device ORDER BY id) AS seq FROM device_log l) numbered
           WHERE seq > (SELECT COUNT(*) FROM device_log c WHERE c.device = numbered.device) - {ring}""",
        "UPDATE devices SET log_seq = COALESCE((SELECT MAX(seq) FROM device_ring r WHERE r.device = devices.name), 0)",
        "DROP TABLE device_log",
        "CREATE INDEX leases_state_expiry ON leases(state, expires_at)",
    ],
    # 7: the image registry: content-addressed images, and which are known-good for what
    [
        """CREATE TABLE images (
            sha256 TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            size BIGINT NOT NULL,
            description TEXT NOT NULL,
            target TEXT NOT NULL,
            uploader TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            last_used_at DOUBLE PRECISION NOT NULL
        )""",
        """CREATE TABLE known_good (
            id {serial},
            target TEXT NOT NULL,
            sha256 TEXT NOT NULL REFERENCES images(sha256),
            marked_by TEXT NOT NULL,
            at DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX known_good_target ON known_good(target, id)",
    ],
    # 8: mediated flash: one operation per flash, at most one running per device; a device
    # whose last flash failed part-way needs recovery (the reason; NULL when it does not)
    [
        """CREATE TABLE flash_ops (
            id TEXT PRIMARY KEY,
            device TEXT NOT NULL,
            host TEXT NOT NULL,
            lease_id TEXT,
            requester TEXT NOT NULL,
            purpose TEXT NOT NULL,
            sha256 TEXT NOT NULL,
            image_name TEXT NOT NULL,
            size BIGINT NOT NULL,
            identifier TEXT NOT NULL,
            plugin TEXT NOT NULL,
            state TEXT NOT NULL,
            phase TEXT NOT NULL,
            done_bytes BIGINT NOT NULL,
            message TEXT NOT NULL,
            seconds TEXT NOT NULL,
            boot_id TEXT,
            created_at DOUBLE PRECISION NOT NULL,
            started_at DOUBLE PRECISION,
            ended_at DOUBLE PRECISION
        )""",
        "CREATE UNIQUE INDEX flash_ops_one_per_device ON flash_ops(device) WHERE state IN ('queued', 'running')",
        "CREATE INDEX flash_ops_host ON flash_ops(host, state)",
        "CREATE INDEX flash_ops_device ON flash_ops(device, created_at)",
        "ALTER TABLE devices ADD COLUMN needs_recovery TEXT",
    ],
    # 9: the exporter's long-poll was cut before its answer (its process died): its leases
    # are not ready until its next heartbeat
    ["ALTER TABLE hosts ADD COLUMN link_lost BOOLEAN NOT NULL DEFAULT FALSE"],
    # 10: when a device's state last changed ("offline since" on the web page): its last
    # change into that state in the ring log, else its last update
    [
        "ALTER TABLE devices ADD COLUMN state_since DOUBLE PRECISION",
        """UPDATE devices SET state_since = COALESCE((SELECT MAX(r.at) FROM device_ring r WHERE r.device = devices.name
           AND r.to_state = devices.state AND r.from_state <> r.to_state), updated_at)""",
    ],
    # 11: "conflict" is no longer a state (a claim blocks nothing): the owners of devices
    # left in it apply their next report in full, which recomputes every device's state
    ["UPDATE hosts SET devices_digest = '' WHERE name IN (SELECT host FROM devices WHERE state = 'conflict')"],
    # 12: an image's name is unique for its target, not in the whole registry (and can never
    # read as a digest: images.py refuses such names); a row per file of the registry, pinned
    # while an upload puts it in place, so that a file is removed only once no image row uses
    # it (docs/architecture.md, "Image registry"); what each person holds, counted by the
    # database in the statements that change it (the lease limit and the upload quota)
    [
        {"sqlite": """CREATE TABLE images_by_target (
            sha256 TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            size BIGINT NOT NULL,
            description TEXT NOT NULL,
            target TEXT NOT NULL,
            uploader TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            last_used_at DOUBLE PRECISION NOT NULL,
            UNIQUE (target, name)
        )""",
         "postgresql": "ALTER TABLE images DROP CONSTRAINT images_name_key"},
        {"sqlite": "INSERT INTO images_by_target SELECT sha256, name, size, description, target, uploader, created_at, "
                   "last_used_at FROM images",
         "postgresql": "ALTER TABLE images ADD CONSTRAINT images_target_name UNIQUE (target, name)"},
        {"sqlite": "DROP TABLE images"},
        {"sqlite": "ALTER TABLE images_by_target RENAME TO images"},
        "CREATE INDEX images_name ON images(name)",
        """CREATE TABLE image_files (
            sha256 TEXT PRIMARY KEY,
            pinned_at DOUBLE PRECISION NOT NULL
        )""",
        "INSERT INTO image_files (sha256, pinned_at) SELECT sha256, 0 FROM images",
        """CREATE TABLE user_counts (
            name TEXT PRIMARY KEY,
            live_leases BIGINT NOT NULL,
            image_bytes BIGINT NOT NULL
        )""",
        """INSERT INTO user_counts (name, live_leases, image_bytes)
           SELECT name, SUM(leases), SUM(bytes) FROM (
             SELECT holder AS name, 1 AS leases, 0 AS bytes FROM leases WHERE state IN ('pending', 'active')
             UNION ALL SELECT uploader, 0, size FROM images) held GROUP BY name""",
    ],
    # 13: an admin forgets a device that will not come back (admin forget); its leases stay as
    # history, so a lease no longer needs its device's row. (SQLite enforces no foreign key:
    # the coordinator never turns PRAGMA foreign_keys on.)
    [{"postgresql": "ALTER TABLE leases DROP CONSTRAINT IF EXISTS leases_device_fkey"}],
    # 14: the address a host's exporter reports as its own (its advertise_address): every
    # endpoint of the host is there, and the coordinator fetches a camera's snapshot only
    # there (NULL: an exporter that does not say, whose snapshots are refused)
    ["ALTER TABLE hosts ADD COLUMN address TEXT"],
    # 15: operations of any kind on a device, in one table (flash_ops carried over: a flash is
    # the "flash" kind); at most one live *exclusive* operation a device. The states of
    # devices, leases and operations as CHECK constraints, with the values of
    # core/vocabulary.py (tests/test_vocabulary.py holds the schema to them); a device left in
    # the old state "conflict" is recomputed at its host's next report (migration 11).
    [
        f"""CREATE TABLE operations (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            device TEXT NOT NULL,
            host TEXT NOT NULL,
            lease_id TEXT,
            requester TEXT NOT NULL,
            identifier TEXT NOT NULL,
            plugin TEXT NOT NULL,
            exclusive BOOLEAN NOT NULL,
            destructive BOOLEAN NOT NULL,
            args TEXT NOT NULL,
            image_sha256 TEXT,
            image_name TEXT,
            image_size BIGINT,
            state TEXT NOT NULL {_one_of("state", OPERATION_STATES)},
            phase TEXT NOT NULL,
            progress_done BIGINT NOT NULL,
            progress_total BIGINT,
            progress_unit TEXT NOT NULL,
            message TEXT NOT NULL,
            seconds TEXT NOT NULL,
            result TEXT,
            boot_id TEXT,
            audit_id BIGINT,
            created_at DOUBLE PRECISION NOT NULL,
            started_at DOUBLE PRECISION,
            ended_at DOUBLE PRECISION
        )""",
        """INSERT INTO operations (id, kind, device, host, lease_id, requester, identifier, plugin, exclusive,
               destructive, args, image_sha256, image_name, image_size, state, phase, progress_done,
               progress_total, progress_unit, message, seconds, result, boot_id, audit_id, created_at,
               started_at, ended_at)
           SELECT id, 'flash', device, host, lease_id, requester, identifier, plugin, TRUE, TRUE,
               '{{"purpose": "' || purpose || '"}}', sha256, image_name, size, state, phase, done_bytes, size,
               'bytes', message, seconds, NULL, boot_id, NULL, created_at, started_at, ended_at FROM flash_ops""",
        "DROP TABLE flash_ops",
        "CREATE UNIQUE INDEX operations_one_exclusive_per_device ON operations(device) "
        "WHERE exclusive AND state IN ('queued', 'running')",
        "CREATE INDEX operations_host ON operations(host, state)",
        "CREATE INDEX operations_device ON operations(device, created_at)",
        "CREATE INDEX operations_image ON operations(image_sha256, state)",
        "UPDATE devices SET state = 'offline' WHERE state NOT IN ('unregistered', 'idle', 'allocating', 'in_use', "
        "'reclaiming', 'faulty', 'offline', 'retired')",
        {"postgresql": f"ALTER TABLE devices ADD CONSTRAINT devices_state {_one_of('state', DEVICE_STATES)}"},
        {"postgresql": f"ALTER TABLE devices ADD CONSTRAINT devices_health {_one_of('health', HEALTH_STATES)}"},
        {"postgresql": f"ALTER TABLE leases ADD CONSTRAINT leases_state {_one_of('state', LEASE_STATES)}"},
        # SQLite adds a constraint only by building the table anew
        {"sqlite": f"""CREATE TABLE devices_checked (
            name TEXT PRIMARY KEY,
            class TEXT NOT NULL,
            tags TEXT NOT NULL,
            host TEXT,
            state TEXT NOT NULL {_one_of("state", DEVICE_STATES)},
            present BOOLEAN NOT NULL,
            health TEXT NOT NULL {_one_of("health", HEALTH_STATES)},
            health_reason TEXT NOT NULL,
            conflict_host TEXT,
            reclaim_lease TEXT,
            busy_by TEXT NOT NULL,
            retired BOOLEAN NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL,
            resources TEXT NOT NULL DEFAULT '[]',
            report_digest TEXT,
            log_seq BIGINT NOT NULL DEFAULT 0,
            needs_recovery TEXT,
            state_since DOUBLE PRECISION
        )"""},
        {"sqlite": "INSERT INTO devices_checked (name, class, tags, host, state, present, health, health_reason, "
                   "conflict_host, reclaim_lease, busy_by, retired, created_at, updated_at, resources, report_digest, "
                   "log_seq, needs_recovery, state_since) SELECT name, class, tags, host, state, present, health, "
                   "health_reason, conflict_host, reclaim_lease, busy_by, retired, created_at, updated_at, resources, "
                   "report_digest, log_seq, needs_recovery, state_since FROM devices"},
        {"sqlite": "DROP TABLE devices"},
        {"sqlite": "ALTER TABLE devices_checked RENAME TO devices"},
        {"sqlite": "CREATE INDEX devices_host ON devices(host)"},
        {"sqlite": "CREATE INDEX devices_conflict_host ON devices(conflict_host)"},
        {"sqlite": f"""CREATE TABLE leases_checked (
            id TEXT PRIMARY KEY,
            device TEXT NOT NULL,
            holder TEXT NOT NULL,
            state TEXT NOT NULL {_one_of("state", LEASE_STATES)},
            created_at DOUBLE PRECISION NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL,
            ended_at DOUBLE PRECISION,
            end_reason TEXT,
            secret TEXT
        )"""},
        {"sqlite": "INSERT INTO leases_checked (id, device, holder, state, created_at, expires_at, ended_at, "
                   "end_reason, secret) SELECT id, device, holder, state, created_at, expires_at, ended_at, "
                   "end_reason, secret FROM leases"},
        {"sqlite": "DROP TABLE leases"},
        {"sqlite": "ALTER TABLE leases_checked RENAME TO leases"},
        {"sqlite": "CREATE UNIQUE INDEX leases_one_live_per_device ON leases(device) "
                   "WHERE state IN ('pending', 'active')"},
        {"sqlite": "CREATE INDEX leases_holder ON leases(holder, state)"},
        {"sqlite": "CREATE INDEX leases_state_expiry ON leases(state, expires_at)"},
    ],
    # 16: who gets the next lease (docs/architecture.md, "Who gets the next lease"): queue
    # tickets, a token's kind (a person's or an agent's), each person's waiting tickets
    # counted; what runs between two leases ("Steps between leases"): a device's steps as its
    # exporter reports them, the one running and its operation, a fault a failed step left
    [
        f"""CREATE TABLE tickets (
            id TEXT PRIMARY KEY,
            requester TEXT NOT NULL,
            kind TEXT NOT NULL {_one_of("kind", TICKET_KINDS)},
            device TEXT,
            device_class TEXT,
            tags TEXT NOT NULL,
            ttl_s DOUBLE PRECISION NOT NULL,
            state TEXT NOT NULL {_one_of("state", TICKET_STATES)},
            created_at DOUBLE PRECISION NOT NULL,
            granted_at DOUBLE PRECISION,
            ended_at DOUBLE PRECISION,
            lease_id TEXT,
            granted_device TEXT,
            reason TEXT NOT NULL DEFAULT ''
        )""",
        "CREATE INDEX tickets_waiting ON tickets(state, created_at)",
        "CREATE INDEX tickets_requester ON tickets(requester, state)",
        "CREATE INDEX tickets_lease ON tickets(lease_id)",
        f"ALTER TABLE tokens ADD COLUMN kind TEXT NOT NULL DEFAULT 'person' {_one_of('kind', TOKEN_KINDS)}",
        "ALTER TABLE user_counts ADD COLUMN open_tickets BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE devices ADD COLUMN steps TEXT NOT NULL DEFAULT '[]'",
        "ALTER TABLE devices ADD COLUMN reclaim_step INTEGER",
        "ALTER TABLE devices ADD COLUMN reclaim_op TEXT",
        "ALTER TABLE devices ADD COLUMN fault TEXT",
        "ALTER TABLE operations ADD COLUMN progress_detail TEXT NOT NULL DEFAULT ''",
        "CREATE INDEX devices_state_class ON devices(state, class)",
    ],
    # 17: jobs and their evidence (docs/architecture.md, "Jobs and evidence"): a job, its cells
    # (a device each, with its fingerprint), its runs (append-only, one row per (job, cell,
    # seq)), and the tickets and leases it made, which end with it; each person's open jobs
    # counted; the facts plugins add to a device's fingerprint, written by the heartbeat's own upsert
    [
        f"""CREATE TABLE jobs (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            kind TEXT NOT NULL {_one_of("kind", TICKET_KINDS)},
            state TEXT NOT NULL {_one_of("state", JOB_STATES)},
            reason TEXT NOT NULL DEFAULT '',
            spec TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            started_at DOUBLE PRECISION,
            ended_at DOUBLE PRECISION,
            worker TEXT,
            worker_user TEXT,
            beat_at DOUBLE PRECISION
        )""",
        "CREATE INDEX jobs_state ON jobs(state, created_at)",
        "CREATE INDEX jobs_beat ON jobs(state, beat_at)",
        "CREATE INDEX jobs_owner ON jobs(owner, created_at)",
        "CREATE INDEX jobs_worker_user ON jobs(worker_user, created_at)",
        """CREATE TABLE job_cells (
            job TEXT NOT NULL,
            cell INTEGER NOT NULL,
            cell_group TEXT NOT NULL,
            device TEXT,
            lease_id TEXT,
            fingerprint TEXT,
            not_run TEXT,
            PRIMARY KEY (job, cell)
        )""",
        f"""CREATE TABLE job_runs (
            job TEXT NOT NULL,
            cell INTEGER NOT NULL,
            seq INTEGER NOT NULL,
            arm TEXT NOT NULL {_one_of("arm", RUN_ARMS)},
            warmup BOOLEAN NOT NULL,
            started_at DOUBLE PRECISION NOT NULL,
            ended_at DOUBLE PRECISION NOT NULL,
            status INTEGER NOT NULL,
            readings TEXT NOT NULL,
            samples TEXT NOT NULL,
            output_tail TEXT NOT NULL,
            PRIMARY KEY (job, cell, seq)
        )""",
        """CREATE TABLE job_leases (
            id {serial},
            job TEXT NOT NULL,
            cell INTEGER NOT NULL,
            ticket_id TEXT,
            lease_id TEXT,
            created_at DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX job_leases_job ON job_leases(job)",
        "ALTER TABLE devices ADD COLUMN facts TEXT NOT NULL DEFAULT '{{}}'",
        "ALTER TABLE user_counts ADD COLUMN open_jobs BIGINT NOT NULL DEFAULT 0",
    ],
    # 18: power (docs/architecture.md, "Power"): the one automatic power cycle of a device's
    # current failure, and when the last was asked for
    [
        "ALTER TABLE devices ADD COLUMN auto_recovery TEXT",
        "ALTER TABLE devices ADD COLUMN auto_recovered_at DOUBLE PRECISION",
    ],
    # 19: meaning in columns, not in words (docs/architecture.md, "Lifecycle"): what left a
    # device faulty (its fault's words were read for it), what the device is (a tag was read),
    # and an operation its exporter's restart or stop cut short (its message was read)
    [
        # (the kinds of then: migration 22 took the others)
        f"ALTER TABLE devices ADD COLUMN fault_kind TEXT "
        f"{_one_of('fault_kind', ('step-failed', 'switched-off', 'unverified-on'))}",
        "UPDATE devices SET fault_kind = 'switched-off' WHERE substr(fault, 1, 12) = 'switched off'",
        "UPDATE devices SET fault_kind = 'unverified-on' WHERE substr(fault, 1, 23) = 'switched on, unverified'",
        "UPDATE devices SET fault_kind = 'step-failed' WHERE fault IS NOT NULL AND fault_kind IS NULL",
        f"ALTER TABLE devices ADD COLUMN fidelity TEXT NOT NULL DEFAULT 'hardware' {_one_of('fidelity', FIDELITIES)}",
        "ALTER TABLE operations ADD COLUMN interrupted BOOLEAN NOT NULL DEFAULT FALSE",
    ],
    # 20: why an operation runs (docs/architecture.md, "Operations"), where a step's place was an
    # argument the exporter looked for: its purpose, and a step's place in the device's steps
    [
        f"ALTER TABLE operations ADD COLUMN purpose TEXT NOT NULL DEFAULT 'lease' {_one_of('purpose', PURPOSES)}",
        "ALTER TABLE operations ADD COLUMN step INTEGER",
        {"sqlite": "UPDATE operations SET purpose = 'step', step = json_extract(args, '$.step') "
                   "WHERE json_extract(args, '$.step') IS NOT NULL AND requester = 'coordinator'",
         "postgresql": "UPDATE operations SET purpose = 'step', step = CAST(CAST(args AS JSONB) ->> 'step' AS INTEGER) "
                       "WHERE (CAST(args AS JSONB) ->> 'step') IS NOT NULL AND requester = 'coordinator'"},
        "UPDATE operations SET purpose = 'settle' WHERE kind = 'settle' AND plugin = 'exporter'",
        "UPDATE operations SET purpose = 'recovery' WHERE lease_id IS NULL AND purpose = 'lease'",
    ],
    # 21: what a ticket may run on (docs/architecture.md, "Who gets the next lease"): its needs
    # (NULL: any device, as before), its fallback to real hardware and when that applies
    [
        f"ALTER TABLE tickets ADD COLUMN needs TEXT {_one_of('needs', NEEDS)}",
        f"ALTER TABLE tickets ADD COLUMN fallback TEXT {_one_of('fallback', NEEDS)}",
        "ALTER TABLE tickets ADD COLUMN fallback_at DOUBLE PRECISION",
    ],
    # 22: health that heals (docs/architecture.md, "Health that heals"): a device's quarantine as
    # its exporter reports it (JSON; NULL: none), and the kinds of fault a permanent health
    # failure and an admin leave. A column's CHECK changes only with the column on SQLite: the
    # column is made anew, filled, and takes the old one's name (both databases alike)
    [
        "ALTER TABLE devices ADD COLUMN quarantine TEXT",
        # (the kinds of then: migration 23 took lab-failures)
        f"ALTER TABLE devices ADD COLUMN fault_kind_new TEXT {_one_of('fault_kind_new', FAULT_KINDS[:5])}",
        "UPDATE devices SET fault_kind_new = fault_kind",
        "ALTER TABLE devices DROP COLUMN fault_kind",
        "ALTER TABLE devices RENAME COLUMN fault_kind_new TO fault_kind",
    ],
    # 23: lab failures (docs/architecture.md, "Lab failures"): whose failure a run and a cell's
    # attempt was, a cell's attempts (a retry starts the cell again on another device: its runs
    # and its report are the attempt's own, so both keys take it), each device's lab failures
    # in a row, and the fault two of them leave. Tables whose key changes are made anew, filled
    # and take the old one's name (both databases alike)
    [
        f"""CREATE TABLE job_runs_new (
            job TEXT NOT NULL,
            cell INTEGER NOT NULL,
            attempt INTEGER NOT NULL DEFAULT 0,
            seq INTEGER NOT NULL,
            arm TEXT NOT NULL {_one_of("arm", RUN_ARMS)},
            warmup BOOLEAN NOT NULL,
            started_at DOUBLE PRECISION NOT NULL,
            ended_at DOUBLE PRECISION NOT NULL,
            status INTEGER NOT NULL,
            readings TEXT NOT NULL,
            samples TEXT NOT NULL,
            output_tail TEXT NOT NULL,
            failure TEXT {_one_of("failure", FAILURE_KINDS)},
            PRIMARY KEY (job, cell, attempt, seq)
        )""",
        "INSERT INTO job_runs_new (job, cell, attempt, seq, arm, warmup, started_at, ended_at, status, readings, "
        "samples, output_tail) SELECT job, cell, 0, seq, arm, warmup, started_at, ended_at, status, readings, samples, "
        "output_tail FROM job_runs",
        "DROP TABLE job_runs",
        "ALTER TABLE job_runs_new RENAME TO job_runs",
        f"""CREATE TABLE job_cells_new (
            job TEXT NOT NULL,
            cell INTEGER NOT NULL,
            attempt INTEGER NOT NULL DEFAULT 0,
            cell_group TEXT NOT NULL,
            device TEXT,
            lease_id TEXT,
            fingerprint TEXT,
            not_run TEXT,
            failure TEXT {_one_of("failure", FAILURE_KINDS)},
            reason TEXT NOT NULL DEFAULT '',
            PRIMARY KEY (job, cell, attempt)
        )""",
        "INSERT INTO job_cells_new (job, cell, attempt, cell_group, device, lease_id, fingerprint, not_run) "
        "SELECT job, cell, 0, cell_group, device, lease_id, fingerprint, not_run FROM job_cells",
        "DROP TABLE job_cells",
        "ALTER TABLE job_cells_new RENAME TO job_cells",
        "ALTER TABLE devices ADD COLUMN lab_failures INTEGER NOT NULL DEFAULT 0",
        f"ALTER TABLE devices ADD COLUMN fault_kind_new TEXT {_one_of('fault_kind_new', FAULT_KINDS)}",
        "UPDATE devices SET fault_kind_new = fault_kind",
        "ALTER TABLE devices DROP COLUMN fault_kind",
        "ALTER TABLE devices RENAME COLUMN fault_kind_new TO fault_kind",
    ],
    # 24: leases that live as long as their client (docs/architecture.md, "Leases that live as
    # long as their client"): a lease's keepalive (NULL: none) and its own end, which a
    # keep-alive never passes (a lease of before ends when it expires); a ticket's keepalive
    # and when it lapses unless its requester reads it; whether a flash read back what it wrote
    [
        "ALTER TABLE leases ADD COLUMN keepalive_s DOUBLE PRECISION",
        "ALTER TABLE leases ADD COLUMN ends_at DOUBLE PRECISION",
        "UPDATE leases SET ends_at = expires_at",
        "ALTER TABLE tickets ADD COLUMN keepalive_s DOUBLE PRECISION",
        "ALTER TABLE tickets ADD COLUMN lapses_at DOUBLE PRECISION",
        "CREATE INDEX tickets_lapse ON tickets(state, lapses_at)",
        "ALTER TABLE operations ADD COLUMN verified BOOLEAN NOT NULL DEFAULT FALSE",
    ],
    # 25: shares of one lab (docs/architecture.md, "Shares of one lab"): a token's scope
    # (JSON; NULL: unscoped) and priority band, set by an admin; a ticket's band (its
    # requester's token's, when it was made) and its turn among its requester's (fair share)
    [
        "ALTER TABLE tokens ADD COLUMN scope TEXT",
        f"ALTER TABLE tokens ADD COLUMN band TEXT NOT NULL DEFAULT 'normal' {_one_of('band', BANDS)}",
        f"ALTER TABLE tickets ADD COLUMN band TEXT NOT NULL DEFAULT 'normal' {_one_of('band', BANDS)}",
        "ALTER TABLE tickets ADD COLUMN turn INTEGER NOT NULL DEFAULT 0",
    ],
    # 26: a scope's leases and budget (docs/architecture.md, "Shares of one lab"): the token a
    # lease or ticket was made with (a ticket's grant holds its token's budget), what a lease
    # holds of its token's budget (seconds, from when, in which period, whether the budget cut
    # it short) and whether it counts against its token's most leases at once; each token's
    # held and used device-seconds per period (a UTC day, or "token"), and its live leases
    [
        "ALTER TABLE leases ADD COLUMN token_id TEXT",
        "ALTER TABLE leases ADD COLUMN held_s DOUBLE PRECISION",
        "ALTER TABLE leases ADD COLUMN held_from DOUBLE PRECISION",
        "ALTER TABLE leases ADD COLUMN held_period TEXT",
        "ALTER TABLE leases ADD COLUMN budget_capped BOOLEAN NOT NULL DEFAULT FALSE",
        "ALTER TABLE leases ADD COLUMN token_counted BOOLEAN NOT NULL DEFAULT FALSE",
        "ALTER TABLE tickets ADD COLUMN token_id TEXT",
        """CREATE TABLE token_usage (
            token_id TEXT NOT NULL,
            period TEXT NOT NULL,
            held_s DOUBLE PRECISION NOT NULL,
            used_s DOUBLE PRECISION NOT NULL,
            last_hold_s DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (token_id, period)
        )""",
        """CREATE TABLE token_counts (
            token_id TEXT PRIMARY KEY,
            live_leases BIGINT NOT NULL
        )""",
    ],
    # 27: a waiting ticket's estimate reads the latest ended leases of a class
    # (docs/architecture.md, "Shares of one lab"): read newest first, not sorted from all of them
    [
        "CREATE INDEX leases_ended ON leases(ended_at)",
    ],
    # 28: what is finite, shared (docs/architecture.md, "Shares of one lab"): the runs a person
    # has stored (finished jobs' too, until deleted), counted as the other shares; operations
    # found by their lease (a status coalesced) and pruned by their end, the audit by its time
    [
        "ALTER TABLE user_counts ADD COLUMN stored_runs BIGINT NOT NULL DEFAULT 0",
        """INSERT INTO user_counts (name, live_leases, image_bytes, open_tickets, open_jobs, stored_runs)
           SELECT j.owner, 0, 0, 0, 0, 0 FROM jobs j WHERE NOT EXISTS (SELECT 1 FROM user_counts c
               WHERE c.name = j.owner) GROUP BY j.owner""",
        """UPDATE user_counts SET stored_runs = (SELECT COUNT(*) FROM job_runs r JOIN jobs j ON j.id = r.job
               WHERE j.owner = user_counts.name)""",
        "CREATE INDEX operations_lease ON operations(lease_id, state)",
        "CREATE INDEX operations_ended ON operations(ended_at)",
        "CREATE INDEX audit_at ON audit(at)",
    ],
    # 29: a job's tickets have its submitter's band, as its kind (docs/architecture.md, "Shares
    # of one lab": a ticket's band is its requester's token's)
    [
        f"ALTER TABLE jobs ADD COLUMN band TEXT NOT NULL DEFAULT 'normal' {_one_of('band', BANDS)}",
    ],
    # 30: the token that submitted a job (docs/architecture.md, "Shares of one lab"): its leases
    # are held to that token's scope and budget as they are now (NULL: a job of before, unscoped)
    ["ALTER TABLE jobs ADD COLUMN token_id TEXT"],
]
