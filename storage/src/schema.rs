//! The schema and its migrations.
//!
//! The database records its schema version in `PRAGMA user_version`; opening
//! applies every migration after it, in order, each in its own transaction
//! with the version bump. A database newer than this build is refused.
//!
//! Migration 1 is the schema as it stood before versioning (every statement
//! `IF NOT EXISTS`, so a data dir written then opens unchanged); columns that
//! were added to it later without a version are added when missing.

use anyhow::{bail, Context, Result};
use rusqlite::Connection;

use super::sql::Db;

/// One step of the schema: applied once, in order.
struct Migration {
    /// What it does, for errors and logs.
    name: &'static str,
    apply: fn(&Connection) -> Result<()>,
}

/// Every migration; the schema version is the number applied.
const MIGRATIONS: &[Migration] = &[
    Migration {
        name: "initial schema: streams, events, cursors, components, checkpoints, effects",
        apply: initial,
    },
    Migration {
        name: "processor_failures: the last failure of a processor instance, in full",
        apply: processor_failures,
    },
    Migration {
        name: "effects: the processor outbox keyed by effect identity, and component versions",
        apply: effects_and_versions,
    },
    Migration {
        name: "pending_refolds and pending_resumes: what a new version sets off, until done",
        apply: pending_refolds,
    },
    Migration {
        name: "ingest: accepted events not yet appended, JetStream fences and their diagnostics",
        apply: ingest,
    },
    Migration {
        name: "effects.lease_id: every lease of an effect numbered, never reused",
        apply: effect_lease_ids,
    },
    Migration {
        name: "processor_keys: processors' keyed state, a bucket per checkpoint",
        apply: processor_keys,
    },
    Migration {
        name: "subscription_cursors.attempts and last_error: a failing run's failure survives restarts",
        apply: cursor_failures,
    },
    Migration {
        name: "ingest_drops: HTTP ingest events dropped for good, and why (the latest 64)",
        apply: ingest_drops,
    },
    Migration {
        name: "subscription_cursors.measurements: a run's next attempt, bytes and latencies survive restarts",
        apply: cursor_measurements,
    },
    Migration {
        name: "pending_refolds.replay_effects: whether a refold stores history's effects",
        apply: refold_replay_effects,
    },
    Migration {
        name: "pending_refolds.shadow: a version folded beside the live one, not switched to",
        apply: refold_shadow,
    },
    Migration {
        name: "ingest_pending.parked_at: accepted events refused for good, kept until settled",
        apply: ingest_parked,
    },
    Migration {
        name: "effects.not_before_ms: an effect not attempted before its time",
        apply: effect_not_before,
    },
    Migration {
        name: "streams.bytes: the bytes of a stream's stored events (a project's storage bound)",
        apply: stream_bytes,
    },
    Migration {
        name: "webhook_secrets: a project's secrets that sign its webhooks",
        apply: webhook_secrets,
    },
    Migration {
        name: "effects.group_key and destination: ordered groups, and where a webhook effect goes",
        apply: effect_groups,
    },
    Migration {
        name: "processor_bases: a processor instance's state and keys kept before retention removes what it folded",
        apply: processor_bases,
    },
    Migration {
        name: "scratch_buckets: the keyed state a shadow or a refold folds, kept in storage until it is promoted or dropped",
        apply: scratch_buckets,
    },
    Migration {
        name: "event_bodies and event_parts: a large event's body written in parts before the commit that appends it",
        apply: event_parts,
    },
    Migration {
        name: "effects_group_open: the effects of a group not done yet, not its history",
        apply: effect_group_open,
    },
];

/// `effects_group_open` replaces `effects_by_group`: whether an effect
/// heads its group ([`crate::effects::GROUP_HEAD`]) asks for an earlier
/// effect of the group not done yet, and an index of those alone answers
/// with its first entry, where an index of the whole group read past
/// every settled effect of its history (each look, for each candidate).
const EFFECT_GROUP_OPEN: &str = "
CREATE INDEX IF NOT EXISTS effects_group_open ON effects (project, path, component, group_key, id)
    WHERE group_key IS NOT NULL AND status IN ('pending', 'running', 'failed');
DROP INDEX IF EXISTS effects_by_group;
";

fn effect_group_open(conn: &Connection) -> Result<()> {
    conn.execute_batch(EFFECT_GROUP_OPEN)?;
    Ok(())
}

/// A large event's body, written in parts of its own, each in a
/// transaction of its own, before the commit that appends the event
/// (whose `body` is then `#parts:{id}:{bytes}`): the commit that holds it
/// is small, so other projects' commits pass between the parts
/// (`writer.rs`). `committed` is set by that commit; bodies never
/// committed (the process stopped first) are dropped at open.
const EVENT_PARTS: &str = "
CREATE TABLE IF NOT EXISTS event_bodies (
    id        BIGINT PRIMARY KEY,
    stream    BIGINT,
    \"offset\"  BIGINT,
    committed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS event_bodies_by_event ON event_bodies (stream, \"offset\");
CREATE TABLE IF NOT EXISTS event_parts (
    body BIGINT NOT NULL,
    seq  INTEGER NOT NULL,
    part TEXT NOT NULL,
    PRIMARY KEY (body, seq)
);
";

fn event_parts(conn: &Connection) -> Result<()> {
    conn.execute_batch(EVENT_PARTS)?;
    Ok(())
}

/// The keyed state a shadow or a refold of a processor instance folds
/// (`processor_keys` rows of `bucket`), kept in storage rather than memory
/// while it folds: a promotion or a refold's switch makes the bucket the
/// instance's (and its row goes); a discarded, replaced or failed fold
/// drops both. One per (instance, purpose): a fold that starts drops any
/// earlier one's. Rows whose component has no pending refold or shadow of
/// `digest` any more are dropped at start.
const SCRATCH_BUCKETS: &str = "
CREATE TABLE IF NOT EXISTS scratch_buckets (
    bucket    BIGINT PRIMARY KEY,
    project   TEXT NOT NULL,
    path      TEXT NOT NULL,
    component TEXT NOT NULL,
    digest    TEXT NOT NULL,
    purpose   TEXT NOT NULL
);
";

fn scratch_buckets(conn: &Connection) -> Result<()> {
    conn.execute_batch(SCRATCH_BUCKETS)?;
    Ok(())
}

/// A processor instance's **base**: its state and keyed state (a bucket of
/// its own, copied from its checkpoint's) at `offset`, kept before
/// retention removes events it folded; refolds and verification start
/// from it. `chain` is the stream's removal digest it was kept for.
const PROCESSOR_BASES: &str = "
CREATE TABLE IF NOT EXISTS processor_bases (
    stream    BIGINT NOT NULL,
    component TEXT NOT NULL,
    stream_id TEXT NOT NULL,
    \"offset\"  BIGINT NOT NULL,
    digest    TEXT NOT NULL,
    state     TEXT NOT NULL,
    bucket    BIGINT NOT NULL,
    chain     TEXT NOT NULL,
    PRIMARY KEY (stream, component)
);
";

fn processor_bases(conn: &Connection) -> Result<()> {
    conn.execute_batch(PROCESSOR_BASES)?;
    Ok(())
}

/// `effects.group_key`: an effect's ordering group (also in its stored
/// target, where effects stored before this column keep it: copied over),
/// and the index that finds the earlier effects of a group
/// ([`crate::effects::GROUP_HEAD`]); `effects.destination`: a webhook
/// effect's host name, whose places it takes (an unsettled one stored
/// before gets it here).
const EFFECT_GROUPS: &str = "
ALTER TABLE effects ADD COLUMN group_key TEXT;
ALTER TABLE effects ADD COLUMN destination TEXT;
UPDATE effects SET group_key = json_extract(target, '$.group')
    WHERE target LIKE '%\"group\"%';
CREATE INDEX effects_by_group ON effects (project, path, component, group_key, id)
    WHERE group_key IS NOT NULL;
";

/// [`EFFECT_GROUPS`] on PostgreSQL (the host name as `url::Url` reads it,
/// by pattern: after the scheme and any user, up to a port, path, query or
/// fragment).
const EFFECT_GROUPS_POSTGRES: &str = "
ALTER TABLE effects ADD COLUMN group_key TEXT;
ALTER TABLE effects ADD COLUMN destination TEXT;
UPDATE effects SET group_key = CAST(target AS jsonb) ->> 'group'
    WHERE target LIKE '%\"group\"%';
UPDATE effects SET destination = lower(substring(
        CAST(target AS jsonb) -> 'webhook' ->> 'url'
        FROM '^[A-Za-z][A-Za-z0-9+.-]*://(?:[^@/?#]*@)?(\\[[^]]*\\]|[^:/?#]*)'))
    WHERE status IN ('pending', 'running', 'failed')
      AND (CAST(target AS jsonb) -> 'webhook') IS NOT NULL;
CREATE INDEX effects_by_group ON effects (project, path, component, group_key, id)
    WHERE group_key IS NOT NULL;
";

fn effect_groups(conn: &Connection) -> Result<()> {
    conn.execute_batch(EFFECT_GROUPS)?;
    let unsettled: Vec<(i64, String)> = conn
        .prepare(
            "SELECT id, json_extract(target, '$.webhook.url') FROM effects
             WHERE status IN ('pending', 'running', 'failed')
               AND json_extract(target, '$.webhook.url') IS NOT NULL",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (id, url) in unsettled {
        conn.execute(
            "UPDATE effects SET destination = ?1 WHERE id = ?2",
            rusqlite::params![streamhost_core::delivery::webhook::destination(&url), id],
        )?;
    }
    Ok(())
}

/// `webhook_secrets`: the secret that signs a project's webhooks (Standard
/// Webhooks, `whsec_` and base64) and, during a rotation, the one before
/// it, which signs too until it is retired. The same statement on both
/// engines.
const WEBHOOK_SECRETS: &str = "
CREATE TABLE IF NOT EXISTS webhook_secrets (
    project    TEXT PRIMARY KEY,
    current    TEXT NOT NULL,
    previous   TEXT,
    rotated_at TEXT NOT NULL
);
";

fn webhook_secrets(conn: &Connection) -> Result<()> {
    conn.execute_batch(WEBHOOK_SECRETS)?;
    Ok(())
}

/// `streams.bytes`: the bytes of the stream's stored events (type,
/// idempotency key and body), kept by every commit; a project's stored
/// bytes are the sum over its streams (`[limits] max-project-bytes`).
/// Counted once for the events already stored.
const STREAM_BYTES: &str = "
ALTER TABLE streams ADD COLUMN bytes BIGINT NOT NULL DEFAULT 0;
UPDATE streams SET bytes = (
    SELECT COALESCE(SUM(length(CAST(body AS BLOB)) + length(CAST(type AS BLOB))
        + COALESCE(length(CAST(idempotency_key AS BLOB)), 0)), 0)
    FROM events WHERE events.stream = streams.id);
";

/// [`STREAM_BYTES`] on PostgreSQL.
const STREAM_BYTES_POSTGRES: &str = "
ALTER TABLE streams ADD COLUMN bytes BIGINT NOT NULL DEFAULT 0;
UPDATE streams SET bytes = (
    SELECT COALESCE(SUM(octet_length(body) + octet_length(type)
        + COALESCE(octet_length(idempotency_key), 0)), 0)
    FROM events WHERE events.stream = streams.id);
";

fn stream_bytes(conn: &Connection) -> Result<()> {
    conn.execute_batch(STREAM_BYTES)?;
    Ok(())
}

/// `effects.not_before_ms`: a delayed effect (a timer) is due no earlier;
/// its due time is `due_at_ms`, indexed with its status.
const EFFECT_NOT_BEFORE: &str = "ALTER TABLE effects ADD COLUMN not_before_ms BIGINT";

fn effect_not_before(conn: &Connection) -> Result<()> {
    conn.execute_batch(EFFECT_NOT_BEFORE)?;
    Ok(())
}

/// Parked ingest: a pending row refused for good stays (counted against
/// capacity) with when and why; JetStream messages parked keep their
/// subject, sequence and raw bytes (base64).
const INGEST_PARKED: &str = "
ALTER TABLE ingest_pending ADD COLUMN source TEXT NOT NULL DEFAULT 'http';
ALTER TABLE ingest_pending ADD COLUMN parked_at TEXT;
ALTER TABLE ingest_pending ADD COLUMN reason TEXT;
ALTER TABLE ingest_pending ADD COLUMN nats_subject TEXT;
ALTER TABLE ingest_pending ADD COLUMN nats_sequence BIGINT;
ALTER TABLE ingest_pending ADD COLUMN raw TEXT;
";

fn ingest_parked(conn: &Connection) -> Result<()> {
    conn.execute_batch(INGEST_PARKED)?;
    Ok(())
}

/// A shadow (`?refold=shadow`): folded beside the live version, switched
/// to only when promoted.
const REFOLD_SHADOW: &str =
    "ALTER TABLE pending_refolds ADD COLUMN shadow BIGINT NOT NULL DEFAULT 0";

fn refold_shadow(conn: &Connection) -> Result<()> {
    conn.execute_batch(REFOLD_SHADOW)?;
    Ok(())
}

/// A refold asked with `replayEffects=true` stores history's effects.
const REFOLD_REPLAY_EFFECTS: &str =
    "ALTER TABLE pending_refolds ADD COLUMN replay_effects BIGINT NOT NULL DEFAULT 0";

fn refold_replay_effects(conn: &Connection) -> Result<()> {
    conn.execute_batch(REFOLD_REPLAY_EFFECTS)?;
    Ok(())
}

/// What a run measured, on its cursor row (JSON).
const CURSOR_MEASUREMENTS: &str = "ALTER TABLE subscription_cursors ADD COLUMN measurements TEXT";

fn cursor_measurements(conn: &Connection) -> Result<()> {
    conn.execute_batch(CURSOR_MEASUREMENTS)?;
    Ok(())
}

/// HTTP ingest events the drain could never append, kept with the reason
/// (the latest 64), as the bridge keeps its
/// diagnostics.
const INGEST_DROPS_SQLITE: &str = "
CREATE TABLE ingest_drops (
    id              INTEGER PRIMARY KEY AUTOINCREMENT, -- commit order
    project         TEXT NOT NULL,
    path            TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    reason          TEXT NOT NULL,
    dropped_at      TEXT NOT NULL
);
";

/// The same on PostgreSQL.
const INGEST_DROPS_POSTGRES: &str = "
CREATE TABLE ingest_drops (
    id              BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    project         TEXT NOT NULL,
    path            TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    reason          TEXT NOT NULL,
    dropped_at      TEXT NOT NULL
);
";

fn ingest_drops(conn: &Connection) -> Result<()> {
    conn.execute_batch(INGEST_DROPS_SQLITE)?;
    Ok(())
}

/// A failing run's attempts and last error on its cursor row.
const CURSOR_FAILURES: &str = "
ALTER TABLE subscription_cursors ADD COLUMN attempts BIGINT NOT NULL DEFAULT 0;
ALTER TABLE subscription_cursors ADD COLUMN last_error TEXT;
";

fn cursor_failures(conn: &Connection) -> Result<()> {
    conn.execute_batch(CURSOR_FAILURES)?;
    Ok(())
}

/// Processors' keyed state: rows of a bucket, named by its checkpoint.
const PROCESSOR_KEYS_SQLITE: &str = "
CREATE TABLE processor_keys (
    bucket INTEGER NOT NULL,
    key    TEXT NOT NULL,
    value  BLOB NOT NULL,
    PRIMARY KEY (bucket, key)
) WITHOUT ROWID;
ALTER TABLE processor_checkpoints ADD COLUMN bucket INTEGER NOT NULL DEFAULT 0;
";

/// The same on PostgreSQL; keys compare byte by byte, as on SQLite.
const PROCESSOR_KEYS_POSTGRES: &str = "
CREATE TABLE processor_keys (
    bucket BIGINT NOT NULL,
    key    TEXT COLLATE \"C\" NOT NULL,
    value  BYTEA NOT NULL,
    PRIMARY KEY (bucket, key)
);
ALTER TABLE processor_checkpoints ADD COLUMN bucket BIGINT NOT NULL DEFAULT 0;
";

fn processor_keys(conn: &Connection) -> Result<()> {
    conn.execute_batch(PROCESSOR_KEYS_SQLITE)?;
    Ok(())
}

/// `effects.lease_id`: an execution settles only the lease it took; `:retry`
/// resets `attempts`, never this, so a stale executor cannot settle a
/// later execution (no ABA).
const EFFECT_LEASE_IDS: &str = "ALTER TABLE effects ADD COLUMN lease_id BIGINT NOT NULL DEFAULT 0";

fn effect_lease_ids(conn: &Connection) -> Result<()> {
    conn.execute_batch(EFFECT_LEASE_IDS)?;
    Ok(())
}

/// The schema version this build writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

const INITIAL: &str = r"
CREATE TABLE IF NOT EXISTS streams (
    id           INTEGER PRIMARY KEY,
    project      TEXT NOT NULL,   -- '' for the global namespace
    path         TEXT NOT NULL,
    stream_id    TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    head_offset  INTEGER NOT NULL, -- highest offset assigned, ephemeral ones included
    state_json   TEXT NOT NULL,    -- cached core state, verified against the log on load
    state_offset INTEGER NOT NULL, -- the last committed offset folded into state_json
    UNIQUE (project, path)
);
CREATE TABLE IF NOT EXISTS events (
    stream          INTEGER NOT NULL,
    offset          INTEGER NOT NULL,
    type            TEXT NOT NULL,
    idempotency_key TEXT,
    body            TEXT NOT NULL  -- the committed event as served, JSON
);
CREATE UNIQUE INDEX IF NOT EXISTS events_by_offset ON events (stream, offset);
CREATE UNIQUE INDEX IF NOT EXISTS events_by_key ON events (stream, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- Delivery cursors of push subscriptions: a repairable cache of core state.
CREATE TABLE IF NOT EXISTS subscription_cursors (
    stream              INTEGER NOT NULL,
    subscription_key    TEXT NOT NULL,
    generation          INTEGER NOT NULL, -- cursorChangedAtSourceOffset of the run
    acknowledged_offset INTEGER NOT NULL,
    failing_offset      INTEGER,          -- skip policy: the event failing alone ...
    failing_attempts    INTEGER NOT NULL DEFAULT 0, -- ... how often ...
    skips               INTEGER NOT NULL DEFAULT 0, -- ... and skips since the last success
    PRIMARY KEY (stream, subscription_key)
);
-- Deployed components: the current digest per (project, name); bytes by digest.
CREATE TABLE IF NOT EXISTS components (
    project     TEXT NOT NULL,
    name        TEXT NOT NULL,
    digest      TEXT NOT NULL,
    exports     TEXT NOT NULL, -- JSON array of exported function names
    deployed_at TEXT NOT NULL,
    PRIMARY KEY (project, name)
);
CREATE TABLE IF NOT EXISTS component_blobs (
    digest TEXT PRIMARY KEY,
    bytes  BLOB NOT NULL
);
-- Processor instances: checkpoint and state, committed together.
CREATE TABLE IF NOT EXISTS processor_checkpoints (
    stream            INTEGER NOT NULL,
    component         TEXT NOT NULL,
    stream_id         TEXT NOT NULL,
    checkpoint_offset INTEGER NOT NULL,
    state             TEXT NOT NULL,
    digest            TEXT NOT NULL,
    updated_at        TEXT NOT NULL,
    PRIMARY KEY (stream, component)
);
-- Effects returned by folds, committed with their checkpoint (the outbox).
CREATE TABLE IF NOT EXISTS processor_effects (
    stream            INTEGER NOT NULL,
    component         TEXT NOT NULL,
    checkpoint_offset INTEGER NOT NULL,
    effect_key        TEXT NOT NULL,
    effect            TEXT NOT NULL, -- JSON
    PRIMARY KEY (stream, component, effect_key)
);
";

fn initial(conn: &Connection) -> Result<()> {
    conn.execute_batch(INITIAL)?;
    // Added to migration 1's table before versioning existed.
    for (column, decl) in [
        ("failing_offset", "INTEGER"),
        ("failing_attempts", "INTEGER NOT NULL DEFAULT 0"),
        ("skips", "INTEGER NOT NULL DEFAULT 0"),
    ] {
        if !has_column(conn, "subscription_cursors", column)? {
            conn.execute_batch(&format!(
                "ALTER TABLE subscription_cursors ADD COLUMN {column} {decl}"
            ))?;
        }
    }
    Ok(())
}

fn processor_failures(conn: &Connection) -> Result<()> {
    conn.execute_batch(
        "CREATE TABLE processor_failures (
            stream     INTEGER NOT NULL,
            component  TEXT NOT NULL,
            stream_id  TEXT NOT NULL,
            failed_at  TEXT NOT NULL,
            offset     INTEGER,          -- the event that failed alone, if one did
            message    TEXT NOT NULL,    -- the whole message, uncapped
            repro      TEXT,             -- the wasmtime command that reproduces the call
            PRIMARY KEY (stream, component)
        );",
    )?;
    Ok(())
}

/// The outbox as it runs: one row per effect identity (project, source path,
/// component, key), surviving a reset of its source stream, with its lease
/// and settlement. `due_at_ms` is when a `pending` effect may run next, or
/// when a `running` effect's lease expires. Effects stored before they ran
/// (schema 2) are kept `cancelled`, with a note: `:retry` runs one.
fn effects_and_versions(conn: &Connection) -> Result<()> {
    conn.execute_batch(
        "CREATE TABLE effects (
            id                INTEGER PRIMARY KEY AUTOINCREMENT,
            project           TEXT NOT NULL,   -- '' for the global namespace
            path              TEXT NOT NULL,   -- the source stream
            stream_id         TEXT NOT NULL,   -- its lifetime that produced the effect
            component         TEXT NOT NULL,
            effect_key        TEXT NOT NULL,
            checkpoint_offset INTEGER NOT NULL,
            target            TEXT NOT NULL,   -- JSON {\"append\"|\"webhook\"|\"itx\": {...}}
            status            TEXT NOT NULL,   -- pending | running | succeeded | failed | cancelled
            attempts          INTEGER NOT NULL DEFAULT 0,
            due_at_ms         INTEGER NOT NULL,
            last_error        TEXT,
            result            TEXT,            -- JSON, what an itx call returned
            retries           INTEGER NOT NULL DEFAULT 0, -- :retry calls, for the error line's key
            created_at        TEXT NOT NULL,
            settled_at        TEXT,
            UNIQUE (project, path, component, effect_key)
        );
        CREATE INDEX effects_due ON effects (status, due_at_ms);
        CREATE INDEX effects_by_stream ON effects (project, path, component, id);
        INSERT OR IGNORE INTO effects (project, path, stream_id, component, effect_key,
                checkpoint_offset, target, status, due_at_ms, last_error, created_at, settled_at)
            SELECT s.project, s.path, s.stream_id, e.component, e.effect_key, e.checkpoint_offset,
                   json_remove(e.effect, '$.key'), 'cancelled', 0,
                   'stored before effects ran (schema 2); :retry runs it',
                   strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
            FROM processor_effects e JOIN streams s ON s.id = e.stream;
        DROP TABLE processor_effects;
        CREATE TABLE component_versions (
            project     TEXT NOT NULL,
            name        TEXT NOT NULL,
            digest      TEXT NOT NULL,
            deployed_at TEXT NOT NULL
        );
        CREATE INDEX component_versions_by_name ON component_versions (project, name);
        INSERT INTO component_versions (project, name, digest, deployed_at)
            SELECT project, name, digest, deployed_at FROM components;",
    )?;
    Ok(())
}

fn pending_refolds(conn: &Connection) -> Result<()> {
    conn.execute_batch(
        "CREATE TABLE pending_refolds (
            project      TEXT NOT NULL,
            name         TEXT NOT NULL,
            digest       TEXT NOT NULL, -- the version to refold with
            requested_at TEXT NOT NULL,
            PRIMARY KEY (project, name)
        );
        CREATE TABLE pending_resumes (
            project TEXT NOT NULL,
            name    TEXT NOT NULL,
            digest  TEXT NOT NULL, -- the new version: halted subscriptions resume once for it
            PRIMARY KEY (project, name)
        );",
    )?;
    Ok(())
}

fn ingest(conn: &Connection) -> Result<()> {
    conn.execute_batch(
        "CREATE TABLE ingest_pending (
            id              INTEGER PRIMARY KEY AUTOINCREMENT, -- acceptance order
            project         TEXT NOT NULL,
            path            TEXT NOT NULL,
            idempotency_key TEXT NOT NULL,
            body            TEXT NOT NULL,    -- the EventInput, JSON
            bytes           INTEGER NOT NULL, -- counted against [ingest] max-pending-bytes
            accepted_at     TEXT NOT NULL,
            UNIQUE (project, path, idempotency_key)
        );
        CREATE INDEX ingest_pending_by_stream ON ingest_pending (project, path, id);
        CREATE TABLE ingest_fences (
            id            INTEGER PRIMARY KEY,
            account       TEXT NOT NULL,
            domain        TEXT NOT NULL,
            stream        TEXT NOT NULL,
            created       TEXT NOT NULL, -- the JetStream stream's creation time
            registered_at TEXT NOT NULL,
            UNIQUE (account, domain, stream, created)
        );
        CREATE TABLE ingest_diagnostics (
            id       INTEGER PRIMARY KEY AUTOINCREMENT, -- commit order
            fence    INTEGER NOT NULL REFERENCES ingest_fences (id),
            sequence INTEGER NOT NULL,
            reason   TEXT NOT NULL,
            UNIQUE (fence, sequence)
        );",
    )?;
    Ok(())
}

/// The whole schema on PostgreSQL, at [`SCHEMA_VERSION`]: the same tables
/// as SQLite's migrations build, with 64-bit integers and identity ids.
/// (PostgreSQL databases start at this version; later versions will add
/// their own steps here.)
const POSTGRES: &str = r#"
CREATE TABLE streams (
    id           BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    project      TEXT NOT NULL,
    path         TEXT NOT NULL,
    stream_id    TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    head_offset  BIGINT NOT NULL,
    state_json   TEXT NOT NULL,
    state_offset BIGINT NOT NULL,
    UNIQUE (project, path)
);
CREATE TABLE events (
    stream          BIGINT NOT NULL,
    "offset"        BIGINT NOT NULL,
    type            TEXT NOT NULL,
    idempotency_key TEXT,
    body            TEXT NOT NULL,
    PRIMARY KEY (stream, "offset")
);
CREATE UNIQUE INDEX events_by_key ON events (stream, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE TABLE subscription_cursors (
    stream              BIGINT NOT NULL,
    subscription_key    TEXT NOT NULL,
    generation          BIGINT NOT NULL,
    acknowledged_offset BIGINT NOT NULL,
    failing_offset      BIGINT,
    failing_attempts    BIGINT NOT NULL DEFAULT 0,
    skips               BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (stream, subscription_key)
);
CREATE TABLE components (
    project     TEXT NOT NULL,
    name        TEXT NOT NULL,
    digest      TEXT NOT NULL,
    exports     TEXT NOT NULL,
    deployed_at TEXT NOT NULL,
    PRIMARY KEY (project, name)
);
CREATE TABLE component_blobs (
    digest TEXT PRIMARY KEY,
    bytes  BYTEA NOT NULL
);
CREATE TABLE component_versions (
    id          BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    project     TEXT NOT NULL,
    name        TEXT NOT NULL,
    digest      TEXT NOT NULL,
    deployed_at TEXT NOT NULL
);
CREATE INDEX component_versions_by_name ON component_versions (project, name);
CREATE TABLE processor_checkpoints (
    stream            BIGINT NOT NULL,
    component         TEXT NOT NULL,
    stream_id         TEXT NOT NULL,
    checkpoint_offset BIGINT NOT NULL,
    state             TEXT NOT NULL,
    digest            TEXT NOT NULL,
    updated_at        TEXT NOT NULL,
    PRIMARY KEY (stream, component)
);
CREATE TABLE processor_failures (
    stream     BIGINT NOT NULL,
    component  TEXT NOT NULL,
    stream_id  TEXT NOT NULL,
    failed_at  TEXT NOT NULL,
    "offset"   BIGINT,
    message    TEXT NOT NULL,
    repro      TEXT,
    PRIMARY KEY (stream, component)
);
CREATE TABLE effects (
    id                BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    project           TEXT NOT NULL,
    path              TEXT NOT NULL,
    stream_id         TEXT NOT NULL,
    component         TEXT NOT NULL,
    effect_key        TEXT NOT NULL,
    checkpoint_offset BIGINT NOT NULL,
    target            TEXT NOT NULL,
    status            TEXT NOT NULL,
    attempts          BIGINT NOT NULL DEFAULT 0,
    due_at_ms         BIGINT NOT NULL,
    last_error        TEXT,
    result            TEXT,
    retries           BIGINT NOT NULL DEFAULT 0,
    created_at        TEXT NOT NULL,
    settled_at        TEXT,
    lease_id          BIGINT NOT NULL DEFAULT 0, -- bumped by every lease, never reset
    UNIQUE (project, path, component, effect_key)
);
CREATE INDEX effects_due ON effects (status, due_at_ms);
CREATE INDEX effects_by_stream ON effects (project, path, component, id);
CREATE TABLE pending_refolds (
    project      TEXT NOT NULL,
    name         TEXT NOT NULL,
    digest       TEXT NOT NULL,
    requested_at TEXT NOT NULL,
    PRIMARY KEY (project, name)
);
CREATE TABLE pending_resumes (
    project TEXT NOT NULL,
    name    TEXT NOT NULL,
    digest  TEXT NOT NULL,
    PRIMARY KEY (project, name)
);
CREATE TABLE ingest_pending (
    id              BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    project         TEXT NOT NULL,
    path            TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    body            TEXT NOT NULL,
    bytes           BIGINT NOT NULL,
    accepted_at     TEXT NOT NULL,
    UNIQUE (project, path, idempotency_key)
);
CREATE INDEX ingest_pending_by_stream ON ingest_pending (project, path, id);
CREATE TABLE ingest_fences (
    id            BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    account       TEXT NOT NULL,
    domain        TEXT NOT NULL,
    stream        TEXT NOT NULL,
    created       TEXT NOT NULL,
    registered_at TEXT NOT NULL,
    UNIQUE (account, domain, stream, created)
);
CREATE TABLE ingest_diagnostics (
    id       BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    fence    BIGINT NOT NULL REFERENCES ingest_fences (id),
    sequence BIGINT NOT NULL,
    reason   TEXT NOT NULL,
    UNIQUE (fence, sequence)
);
"#;

/// One stream round's whole write on PostgreSQL, in one statement (so a
/// group commit's rounds go in one pipelined round trip): the owner's lease
/// checked (`p_owner` NULL: no lease, one host), the stream created
/// (`p_row` NULL) or its head moved from `p_expected` (anything else is
/// refused: a lost commit never leaves a gap), its events inserted (the
/// unique index `events_by_key` checks their idempotency keys against the
/// whole log), its cursor rows written and removed. Every refusal raises,
/// so the statements after it in the transaction fail too.
pub const APPEND_FUNCTION_POSTGRES: &str = r#"
CREATE OR REPLACE FUNCTION streamhost_append_v1(
    p_fence_project TEXT, p_fence_path TEXT, p_owner TEXT, p_epoch BIGINT,
    p_row BIGINT, p_expected BIGINT,
    p_project TEXT, p_path TEXT, p_stream_id TEXT, p_created_at TEXT,
    p_head BIGINT, p_state TEXT, p_state_offset BIGINT,
    p_offsets BIGINT[], p_types TEXT[], p_keys TEXT[], p_bodies TEXT[],
    c_keys TEXT[], c_generations BIGINT[], c_acknowledged BIGINT[],
    c_failing_offsets BIGINT[], c_failing_attempts BIGINT[], c_skips BIGINT[],
    c_attempts BIGINT[], c_last_errors TEXT[], p_removed TEXT[]
) RETURNS BIGINT LANGUAGE plpgsql AS $fn$
DECLARE
    v_owner TEXT;
    v_epoch BIGINT;
    v_head BIGINT;
    v_row BIGINT := p_row;
    v_bytes BIGINT;
BEGIN
    SELECT COALESCE(SUM(octet_length(u.t) + octet_length(u.b) + COALESCE(octet_length(u.k), 0)), 0)
        INTO v_bytes FROM unnest(p_types, p_keys, p_bodies) AS u(t, k, b);
    IF p_owner IS NOT NULL THEN
        SELECT owner, epoch INTO v_owner, v_epoch FROM stream_leases
            WHERE project = p_fence_project AND path = p_fence_path FOR SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'stream % has no lease (this host held epoch %): the write is refused',
                to_json(p_fence_path), p_epoch;
        ELSIF v_owner <> p_owner OR v_epoch <> p_epoch THEN
            RAISE EXCEPTION 'stream % was taken over by host % (lease epoch %; this host held epoch %): a deposed owner''s write is refused',
                to_json(p_fence_path), v_owner, v_epoch, p_epoch;
        END IF;
    END IF;
    IF v_row IS NULL THEN
        INSERT INTO streams (project, path, stream_id, created_at, head_offset, state_json, state_offset, bytes)
            VALUES (p_project, p_path, p_stream_id, p_created_at, p_head, p_state, p_state_offset, v_bytes)
            RETURNING id INTO v_row;
    ELSE
        UPDATE streams SET head_offset = p_head, state_json = p_state, state_offset = p_state_offset,
                bytes = bytes + v_bytes
            WHERE id = v_row AND head_offset = p_expected;
        IF NOT FOUND THEN
            SELECT head_offset INTO v_head FROM streams WHERE id = v_row;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'stream row % is missing', v_row;
            END IF;
            RAISE EXCEPTION 'stream row % has head offset %, expected %', v_row, v_head, p_expected;
        END IF;
    END IF;
    INSERT INTO events (stream, "offset", type, idempotency_key, body)
        SELECT v_row, u.o, u.t, u.k, u.b FROM unnest(p_offsets, p_types, p_keys, p_bodies) AS u(o, t, k, b);
    IF cardinality(c_keys) > 0 THEN
        INSERT INTO subscription_cursors (stream, subscription_key, generation, acknowledged_offset,
                                          failing_offset, failing_attempts, skips, attempts, last_error)
            SELECT v_row, u.k, u.g, u.a, u.fo, u.fa, u.s, u.at, u.e
            FROM unnest(c_keys, c_generations, c_acknowledged, c_failing_offsets,
                        c_failing_attempts, c_skips, c_attempts, c_last_errors)
                AS u(k, g, a, fo, fa, s, at, e)
            ON CONFLICT (stream, subscription_key)
            DO UPDATE SET generation = excluded.generation, acknowledged_offset = excluded.acknowledged_offset,
                failing_offset = excluded.failing_offset, failing_attempts = excluded.failing_attempts,
                skips = excluded.skips, attempts = excluded.attempts, last_error = excluded.last_error;
    END IF;
    IF cardinality(p_removed) > 0 THEN
        DELETE FROM subscription_cursors WHERE stream = v_row AND subscription_key = ANY (p_removed);
    END IF;
    RETURN v_row;
END
$fn$;
"#;

/// Brings a PostgreSQL database to [`SCHEMA_VERSION`]: an empty one gets
/// the whole schema; hosts starting together take turns (an advisory lock).
pub fn migrate_postgres(db: Db<'_>) -> Result<()> {
    db.batch("BEGIN; SELECT pg_advisory_xact_lock(7428190311)")?;
    let result = (|| -> Result<()> {
        db.batch("CREATE TABLE IF NOT EXISTS streamhost_schema (version INTEGER NOT NULL)")?;
        let current = db.query_opt(
            "SELECT version FROM streamhost_schema",
            crate::sql::args![],
            |r| r.int(0),
        )?;
        match current {
            None => {
                db.batch(POSTGRES)?;
                db.batch(PROCESSOR_KEYS_POSTGRES)?;
                db.batch(CURSOR_FAILURES)?;
                db.batch(INGEST_DROPS_POSTGRES)?;
                db.batch(CURSOR_MEASUREMENTS)?;
                db.batch(REFOLD_REPLAY_EFFECTS)?;
                db.batch(REFOLD_SHADOW)?;
                db.batch(INGEST_PARKED)?;
                db.batch(EFFECT_NOT_BEFORE)?;
                db.batch(STREAM_BYTES_POSTGRES)?;
                db.batch(WEBHOOK_SECRETS)?;
                db.batch(EFFECT_GROUPS_POSTGRES)?;
                db.batch(PROCESSOR_BASES)?;
                db.batch(SCRATCH_BUCKETS)?;
                db.batch(EVENT_PARTS)?;
                db.batch(EFFECT_GROUP_OPEN)?;
                db.execute(
                    "INSERT INTO streamhost_schema (version) VALUES (?1)",
                    crate::sql::args![i64::from(SCHEMA_VERSION)],
                )?;
                tracing::info!(version = SCHEMA_VERSION, "schema created on PostgreSQL");
            }
            Some(v) if v == i64::from(SCHEMA_VERSION) => {}
            Some(v @ 5..=20) => {
                if v == 5 {
                    db.batch(EFFECT_LEASE_IDS)?;
                }
                if v <= 6 {
                    db.batch(PROCESSOR_KEYS_POSTGRES)?;
                }
                if v <= 7 {
                    db.batch(CURSOR_FAILURES)?;
                }
                if v <= 8 {
                    db.batch(INGEST_DROPS_POSTGRES)?;
                }
                if v <= 9 {
                    db.batch(CURSOR_MEASUREMENTS)?;
                }
                if v <= 10 {
                    db.batch(REFOLD_REPLAY_EFFECTS)?;
                }
                if v <= 11 {
                    db.batch(REFOLD_SHADOW)?;
                }
                if v <= 12 {
                    db.batch(INGEST_PARKED)?;
                }
                if v <= 13 {
                    db.batch(EFFECT_NOT_BEFORE)?;
                }
                if v <= 14 {
                    db.batch(STREAM_BYTES_POSTGRES)?;
                }
                if v <= 15 {
                    db.batch(WEBHOOK_SECRETS)?;
                }
                if v <= 16 {
                    db.batch(EFFECT_GROUPS_POSTGRES)?;
                }
                if v <= 17 {
                    db.batch(PROCESSOR_BASES)?;
                }
                if v <= 18 {
                    db.batch(SCRATCH_BUCKETS)?;
                }
                if v <= 19 {
                    db.batch(EVENT_PARTS)?;
                }
                db.batch(EFFECT_GROUP_OPEN)?;
                db.execute(
                    "UPDATE streamhost_schema SET version = ?1",
                    crate::sql::args![i64::from(SCHEMA_VERSION)],
                )?;
                tracing::info!(version = SCHEMA_VERSION, "schema migrated on PostgreSQL");
            }
            Some(v) if v > i64::from(SCHEMA_VERSION) => bail!(
                "the database has schema version {v}, newer than this build's {SCHEMA_VERSION}: \
                 run a newer streamhost on it"
            ),
            Some(v) => bail!(
                "the database has schema version {v}, and this build has no migration from it \
                 to {SCHEMA_VERSION} on PostgreSQL"
            ),
        }
        // The tables of several hosts (IF NOT EXISTS: added after version 5
        // was first written on PostgreSQL).
        db.batch(super::lease::SCHEMA)?;
        // Code, not data: (re)defined by every start, versioned by name.
        db.batch(APPEND_FUNCTION_POSTGRES)?;
        Ok(())
    })();
    match result {
        Ok(()) => db.batch("COMMIT"),
        Err(e) => {
            let _ = db.batch("ROLLBACK");
            Err(e)
        }
    }
}

fn has_column(conn: &Connection, table: &str, column: &str) -> Result<bool> {
    let mut stmt = conn.prepare(&format!("PRAGMA table_info({table})"))?;
    let names = stmt
        .query_map([], |r| r.get::<_, String>(1))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(names.iter().any(|n| n == column))
}

/// The schema version recorded in the database.
pub fn version(conn: &Connection) -> Result<u32> {
    Ok(conn.pragma_query_value(None, "user_version", |r| r.get::<_, u32>(0))?)
}

/// Brings the database to [`SCHEMA_VERSION`].
pub fn migrate(conn: &Connection) -> Result<()> {
    let current = version(conn).context("reading user_version")?;
    if current > SCHEMA_VERSION {
        bail!(
            "the database has schema version {current}, newer than this build's {SCHEMA_VERSION}: \
             run a newer streamhost on it"
        );
    }
    for (i, m) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let to = i as u32 + 1;
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let applied =
            (m.apply)(conn).and_then(|()| Ok(conn.pragma_update(None, "user_version", to)?));
        match applied {
            Ok(()) => conn.execute_batch("COMMIT")?,
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                return Err(e.context(format!("schema migration {to} ({})", m.name)));
            }
        }
        tracing::info!(version = to, migration = m.name, "schema migrated");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_database_gets_every_migration_and_reopening_changes_nothing() {
        let conn = Connection::open_in_memory().unwrap();
        migrate(&conn).unwrap();
        assert_eq!(version(&conn).unwrap(), SCHEMA_VERSION);
        assert!(has_column(&conn, "processor_failures", "repro").unwrap());
        assert!(has_column(&conn, "effects", "due_at_ms").unwrap());
        migrate(&conn).unwrap();
        assert_eq!(version(&conn).unwrap(), SCHEMA_VERSION);
    }

    #[test]
    fn a_database_from_before_the_skip_counters_gains_them() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE subscription_cursors (stream INTEGER NOT NULL, subscription_key TEXT NOT NULL,
             generation INTEGER NOT NULL, acknowledged_offset INTEGER NOT NULL,
             PRIMARY KEY (stream, subscription_key));
             INSERT INTO subscription_cursors VALUES (1, 'k', 3, 7);",
        )
        .unwrap();
        migrate(&conn).unwrap();
        let row: (i64, i64) = conn
            .query_row(
                "SELECT acknowledged_offset, skips FROM subscription_cursors",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(row, (7, 0));
    }

    #[test]
    fn effects_stored_before_they_ran_are_kept_cancelled_and_versions_start_from_the_deployed_ones()
    {
        let conn = Connection::open_in_memory().unwrap();
        for m in &MIGRATIONS[..2] {
            (m.apply)(&conn).unwrap();
        }
        conn.pragma_update(None, "user_version", 2).unwrap();
        conn.execute_batch(
            "INSERT INTO streams VALUES (1, 'acme', '/orders', 'sid', 't', 3, '', 0);
             INSERT INTO processor_effects VALUES (1, 'totals', 3, 'k1',
                 '{\"key\":\"k1\",\"webhook\":{\"url\":\"http://x\",\"body\":{}}}');
             INSERT INTO components VALUES ('acme', 'totals', 'sha256:ab', '[]', 't0');",
        )
        .unwrap();
        migrate(&conn).unwrap();
        let (path, key, status, target): (String, String, String, String) = conn
            .query_row(
                "SELECT path, effect_key, status, target FROM effects",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap();
        assert_eq!(
            (path.as_str(), key.as_str(), status.as_str()),
            ("/orders", "k1", "cancelled")
        );
        assert_eq!(target, r#"{"webhook":{"url":"http://x","body":{}}}"#);
        let digest: String = conn
            .query_row("SELECT digest FROM component_versions", [], |r| r.get(0))
            .unwrap();
        assert_eq!(digest, "sha256:ab");
    }

    #[test]
    fn a_newer_database_is_refused_naming_both_versions() {
        let conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        let err = migrate(&conn).unwrap_err().to_string();
        assert!(
            err.contains(&format!("schema version {}", SCHEMA_VERSION + 1)),
            "{err}"
        );
    }
}
