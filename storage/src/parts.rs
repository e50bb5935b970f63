//! Large event bodies in parts (SQLite): a body over [`LARGE_BODY_BYTES`]
//! is written to `event_parts`, [`PART_BYTES`] at a time, each part in a
//! transaction of its own, before the commit that appends its event; the
//! event's row then holds `#parts:{id}:{bytes}` (a body is a JSON object,
//! so no body starts with `#`) and that commit marks the body
//! `committed`. The commit is small, and the writer commits other streams'
//! groups between the parts: one project's large appends cost another's
//! commits at most one part's write, not the whole body's (`writer.rs`).
//! Reads put the parts back together in the read transaction that found
//! the row. Bodies never committed (the process stopped between their
//! parts and their commit) are dropped when the database opens.

use anyhow::{Context, Result};

use super::sql::{args, Db};

/// A body larger than this is written in parts (SQLite).
pub const LARGE_BODY_BYTES: usize = 256 * 1024;
/// The most bytes of one part.
pub const PART_BYTES: usize = 256 * 1024;

/// What an event's row holds for a body written in parts.
pub fn body_ref(id: i64, bytes: usize) -> String {
    format!("#parts:{id}:{bytes}")
}

/// The body id and size a row's body names, if it names parts.
pub fn parse_ref(body: &str) -> Option<(i64, usize)> {
    let rest = body.strip_prefix("#parts:")?;
    let (id, bytes) = rest.split_once(':')?;
    Some((id.parse().ok()?, bytes.parse().ok()?))
}

/// The size of a row's body as the event's: its parts' when it names them.
pub fn body_bytes(body: &str) -> usize {
    parse_ref(body).map_or(body.len(), |(_, bytes)| bytes)
}

/// The row's body as the event's: put together from its parts when it
/// names them (in the caller's read transaction).
pub fn expand(db: Db<'_>, body: String) -> Result<String> {
    let Some((id, bytes)) = parse_ref(&body) else {
        return Ok(body);
    };
    let parts = db.query_all(
        "SELECT part FROM event_parts WHERE body = ?1 ORDER BY seq",
        args![id],
        |r| r.text(0),
    )?;
    let whole = parts.concat();
    anyhow::ensure!(
        whole.len() == bytes,
        "the parts of event body {id} hold {} bytes, not {bytes}",
        whole.len()
    );
    Ok(whole)
}

/// The next part of `body` from byte `from`: up to [`PART_BYTES`], ending
/// on a character boundary.
pub fn next_part(body: &str, from: usize) -> &str {
    let mut end = (from + PART_BYTES).min(body.len());
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    &body[from..end]
}

/// Writes part `seq` of body `id` (the first also records the body,
/// uncommitted), in the caller's transaction.
pub fn write_part(conn: Db<'_>, id: i64, seq: i64, part: &str) -> Result<()> {
    if seq == 0 {
        conn.execute(
            "INSERT INTO event_bodies (id, committed) VALUES (?1, 0)",
            args![id],
        )?;
    }
    conn.execute(
        "INSERT INTO event_parts (body, seq, part) VALUES (?1, ?2, ?3)",
        args![id, seq, part],
    )?;
    Ok(())
}

/// The commit that appends the event at `offset` of stream `row_id` takes
/// body `id` as its own (in its transaction).
pub fn adopt(conn: Db<'_>, id: i64, row_id: i64, offset: u64) -> Result<()> {
    let adopted = conn.execute(
        "UPDATE event_bodies SET committed = 1, stream = ?2, \"offset\" = ?3
         WHERE id = ?1 AND committed = 0",
        args![id, row_id, offset as i64],
    )?;
    anyhow::ensure!(
        adopted == 1,
        "the parts of the body at offset {offset} are missing (body {id})"
    );
    Ok(())
}

/// Drops bodies `ids` that no commit took (their append failed).
pub fn drop_uncommitted(conn: Db<'_>, ids: &[i64]) -> Result<()> {
    for id in ids {
        conn.execute(
            "DELETE FROM event_parts WHERE body IN
                 (SELECT id FROM event_bodies WHERE id = ?1 AND committed = 0)",
            args![*id],
        )?;
        conn.execute(
            "DELETE FROM event_bodies WHERE id = ?1 AND committed = 0",
            args![*id],
        )?;
    }
    Ok(())
}

/// At open: the bodies no commit took (the process stopped first) go.
pub fn drop_all_uncommitted(conn: &rusqlite::Connection) -> Result<()> {
    conn.execute_batch(
        "DELETE FROM event_parts WHERE body IN (SELECT id FROM event_bodies WHERE committed = 0);
         DELETE FROM event_bodies WHERE committed = 0;",
    )
    .context("dropping event bodies no commit took")
}

/// The parts of stream `row_id`'s events through `through` (all: `None`)
/// go, in the caller's transaction (retention, a stream's reset).
pub fn remove(conn: Db<'_>, row_id: i64, through: Option<u64>) -> Result<()> {
    let through = through.map_or(i64::MAX, |t| t.min(i64::MAX as u64) as i64);
    conn.execute(
        "DELETE FROM event_parts WHERE body IN
             (SELECT id FROM event_bodies WHERE stream = ?1 AND \"offset\" <= ?2)",
        args![row_id, through],
    )?;
    conn.execute(
        "DELETE FROM event_bodies WHERE stream = ?1 AND \"offset\" <= ?2",
        args![row_id, through],
    )?;
    Ok(())
}

/// The parts of the event at `offset` go (its body was rewritten: a
/// redaction).
pub fn remove_one(conn: Db<'_>, row_id: i64, offset: u64) -> Result<()> {
    conn.execute(
        "DELETE FROM event_parts WHERE body IN
             (SELECT id FROM event_bodies WHERE stream = ?1 AND \"offset\" = ?2)",
        args![row_id, offset as i64],
    )?;
    conn.execute(
        "DELETE FROM event_bodies WHERE stream = ?1 AND \"offset\" = ?2",
        args![row_id, offset as i64],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_ref_names_its_id_and_size_and_no_json_body_reads_as_one() {
        assert_eq!(parse_ref(&body_ref(42, 7_340_032)), Some((42, 7_340_032)));
        assert_eq!(body_bytes(&body_ref(42, 9)), 9);
        assert_eq!(parse_ref(r##"{"type":"#parts:1:2"}"##), None);
        assert_eq!(body_bytes("{}"), 2);
        assert_eq!(parse_ref("#parts:x:1"), None);
    }

    #[test]
    fn parts_end_on_character_boundaries_and_cover_the_body() {
        let body = "é".repeat(PART_BYTES); // two bytes each
        let mut from = 0;
        let mut parts = Vec::new();
        while from < body.len() {
            let part = next_part(&body, from);
            assert!(!part.is_empty() && part.len() <= PART_BYTES);
            from += part.len();
            parts.push(part);
        }
        assert_eq!(parts.concat(), body);
        assert_eq!(parts.len(), 2);
    }
}
