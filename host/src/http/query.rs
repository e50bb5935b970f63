//! Query-string parsing with errors that name the bad parameter and value.

use super::error::ApiError;
use crate::component::DeployMode;
use crate::host::effects::{EffectFilter, EffectStatus, EFFECT_LIMIT_MAX};
use crate::host::live::Connect;
use crate::host::processors::{KeysQuery, KEYS_LIMIT_MAX};
use crate::host::streams::{StreamsQuery, LIST_LIMIT_MAX};
use crate::stream::canonicalize_path;
use crate::stream::{ReadQuery, READ_LIMIT_MAX};

fn offset(name: &str, value: &str) -> Result<u64, ApiError> {
    let v = value.parse::<u64>().map_err(|_| {
        ApiError::invalid(format!("{name} {value:?} is not a non-negative integer"))
    })?;
    if v > crate::stream::OFFSET_MAX {
        return Err(ApiError::invalid(format!(
            "{name} {value:?} is above {}, the largest offset",
            crate::stream::OFFSET_MAX
        )));
    }
    Ok(v)
}

fn positive(name: &str, value: &str) -> Result<usize, ApiError> {
    value
        .parse::<usize>()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| ApiError::invalid(format!("{name} {value:?} is not a positive integer")))
}

/// A page size from 1 to `max`.
fn limit(value: &str, max: usize) -> Result<usize, ApiError> {
    value
        .parse::<usize>()
        .ok()
        .filter(|l| (1..=max).contains(l))
        .ok_or_else(|| {
            ApiError::invalid(format!("limit {value:?} is not an integer from 1 to {max}"))
        })
}

fn boolean(name: &str, value: &str) -> Result<bool, ApiError> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(ApiError::invalid(format!(
            "{name} {other:?} is not true or false"
        ))),
    }
}

/// Parses the parameters of `:connect`.
pub fn connect_query(query: Option<&str>) -> Result<Connect, ApiError> {
    let mut p = Connect::new();
    for (name, value) in decoded(query)? {
        let v = value.as_str();
        match name.as_str() {
            "connectionKey" => p.connection_key = Some(value.clone()),
            "replayAfterOffset" => p.replay_after_offset = Some(offset(&name, v)?),
            "expectedStreamId" => p.expected_stream_id = Some(value.clone()),
            "maxReplayOffsetGap" => p.max_replay_offset_gap = Some(offset(&name, v)?),
            "eventTypes" => {
                p.event_types = Some(
                    v.split(',')
                        .map(str::trim)
                        .filter(|t| !t.is_empty())
                        .map(str::to_string)
                        .collect(),
                )
            }
            "jsonataCondition" => p.jsonata_condition = Some(value.clone()),
            "events" => p.events = boolean(&name, v)?,
            "state" => p.state = boolean(&name, v)?,
            "maxDeliveryEvents" => p.max_delivery_events = positive(&name, v)?,
            "maxDeliveryBytes" => p.max_delivery_bytes = positive(&name, v)?,
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {other:?} for :connect"
                )))
            }
        }
    }
    Ok(p)
}

/// The query's name/value pairs, percent-decoded.
/// The decoded parameters; a NUL byte (which PostgreSQL cannot store or
/// compare) is refused on every backend, naming the parameter.
fn decoded(query: Option<&str>) -> Result<Vec<(String, String)>, ApiError> {
    form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .map(|(k, v)| {
            if k.contains('\0') || v.contains('\0') {
                return Err(ApiError::invalid(format!(
                    "query parameter {:?} contains a NUL byte",
                    k.replace('\0', "\\0")
                )));
            }
            Ok((k.into_owned(), v.into_owned()))
        })
        .collect()
}

/// Rejects any query parameter.
pub fn no_query(query: Option<&str>) -> Result<(), ApiError> {
    match decoded(query)?.first() {
        None => Ok(()),
        Some((name, _)) => Err(ApiError::invalid(format!(
            "unknown query parameter {name:?}"
        ))),
    }
}

/// Parses `export` of `:events/{offset}/trace` (default `false`).
pub fn export_query(query: Option<&str>) -> Result<bool, ApiError> {
    let mut export = false;
    for (name, value) in decoded(query)? {
        match name.as_str() {
            "export" => export = boolean("export", &value)?,
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {other:?} (export)"
                )))
            }
        }
    }
    Ok(export)
}

/// Parses `afterOffset`, `limit` and `includeEphemeral` of `:events`.
pub fn read_query(query: Option<&str>) -> Result<ReadQuery, ApiError> {
    let mut q = ReadQuery {
        after_offset: 0,
        limit: READ_LIMIT_MAX,
        include_ephemeral: false,
    };
    for (name, value) in decoded(query)? {
        let value = value.as_str();
        match name.as_str() {
            "afterOffset" => q.after_offset = offset("afterOffset", value)?,
            "limit" => q.limit = limit(value, READ_LIMIT_MAX)?,
            "includeEphemeral" => q.include_ephemeral = boolean("includeEphemeral", value)?,
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {other:?} for :events"
                )))
            }
        }
    }
    Ok(q)
}

/// Parses `prefix`, `afterPath` and `limit` of `GET .../streams`.
pub fn list_query(query: Option<&str>) -> Result<StreamsQuery, ApiError> {
    let mut q = StreamsQuery::new();
    for (name, value) in decoded(query)? {
        match name.as_str() {
            "prefix" => {
                if !value.starts_with('/') {
                    return Err(ApiError::invalid(format!(
                        "prefix {value:?} must start with \"/\""
                    )));
                }
                q.prefix = value;
            }
            "afterPath" => q.after_path = Some(value),
            "limit" => q.limit = limit(&value, LIST_LIMIT_MAX)?,
            other => {
                return Err(ApiError::invalid(format!(
                "unknown query parameter {other:?} for the stream list (prefix, afterPath, limit)"
            )))
            }
        }
    }
    Ok(q)
}

/// Parses `prefix`, `after` and `limit` of `:processors/{component}/keys`.
pub fn keys_query(query: Option<&str>) -> Result<KeysQuery, ApiError> {
    let mut q = KeysQuery::new();
    for (name, value) in decoded(query)? {
        match name.as_str() {
            "prefix" => q.prefix = value,
            "after" => q.after = Some(value),
            "limit" => q.limit = limit(&value, KEYS_LIMIT_MAX)?,
            other => {
                return Err(ApiError::invalid(format!(
                "unknown query parameter {other:?} for a processor's keys (prefix, after, limit)"
            )))
            }
        }
    }
    Ok(q)
}

/// Parses `keys` (a key prefix) of `:processors/{component}/at/{offset}`.
pub fn at_query(query: Option<&str>) -> Result<Option<String>, ApiError> {
    let mut keys = None;
    for (name, value) in decoded(query)? {
        match name.as_str() {
            "keys" => keys = Some(value),
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {other:?} for a processor's state at an offset (keys)"
                )))
            }
        }
    }
    Ok(keys)
}

/// Parses `refold` and `replayEffects` of a deploy into its mode
/// ([`DeployMode::from_options`], the one rule).
pub fn deploy_query(query: Option<&str>) -> Result<DeployMode, ApiError> {
    let mut refold: Option<String> = None;
    let mut replay = false;
    for (name, value) in decoded(query)? {
        match name.as_str() {
            "refold" => refold = Some(value),
            "replayEffects" => replay = boolean("replayEffects", &value)?,
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {other:?} for a deploy (refold, replayEffects)"
                )))
            }
        }
    }
    DeployMode::from_options(refold.as_deref(), replay).map_err(ApiError::invalid)
}

/// Parses `stream`, `component`, `status`, `due`, `afterId` and `limit`
/// of `GET /v1/projects/{p}/effects`.
pub fn effect_query(query: Option<&str>) -> Result<EffectFilter, ApiError> {
    let mut q = EffectFilter::new();
    for (name, value) in decoded(query)? {
        match name.as_str() {
            "stream" => q.stream = Some(canonicalize_path(&value)?),
            "component" => q.component = Some(value),
            "status" => {
                let status = EffectStatus::parse(&value).ok_or_else(|| {
                    let all: Vec<&str> = EffectStatus::ALL.iter().map(|s| s.as_str()).collect();
                    ApiError::invalid(format!(
                        "status {value:?} is not an effect status ({})",
                        all.join(", ")
                    ))
                })?;
                q.status = Some(status);
            }
            "due" => {
                let time = value.strip_prefix("before:").ok_or_else(|| {
                    ApiError::invalid(format!(
                        "due {value:?} must be before:T (T an RFC 3339 time or milliseconds since the epoch)"
                    ))
                })?;
                q.due_before_ms = Some(
                    crate::clock::parse_time(time)
                        .map_err(|e| ApiError::invalid(format!("due {value:?}: {e}")))?,
                );
            }
            "afterId" => q.after_id = offset("afterId", &value)? as i64,
            "limit" => q.limit = limit(&value, EFFECT_LIMIT_MAX)?,
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {other:?} for the effect list \
                     (stream, component, status, due, afterId, limit)"
                )))
            }
        }
    }
    Ok(q)
}

/// The query of `GET /v1/projects/{p}/ingest/parked`.
pub fn parked_query(query: Option<&str>) -> Result<crate::ingest::ParkedQuery, ApiError> {
    let mut q = crate::ingest::ParkedQuery::default();
    for (name, value) in decoded(query)? {
        match name.as_str() {
            "path" => q.path = Some(canonicalize_path(&value)?),
            "afterId" => q.after_id = offset("afterId", &value)? as i64,
            "limit" => q.limit = limit(&value, crate::ingest::PARKED_LIMIT_MAX)?,
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {other:?} for the parked events (path, afterId, \
                     limit)"
                )))
            }
        }
    }
    Ok(q)
}

/// The query string [`parked_query`] reads back as `q`.
pub fn render_parked(q: &crate::ingest::ParkedQuery) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    if let Some(path) = &q.path {
        out.append_pair("path", path);
    }
    if q.after_id > 0 {
        out.append_pair("afterId", &q.after_id.to_string());
    }
    out.append_pair("limit", &q.limit.to_string());
    out.finish()
}

/// The query string [`read_query`] reads back as `q`.
pub fn render_read(q: &ReadQuery) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    out.append_pair("afterOffset", &q.after_offset.to_string())
        .append_pair("limit", &q.limit.to_string())
        .append_pair("includeEphemeral", &q.include_ephemeral.to_string());
    out.finish()
}

/// The query string [`connect_query`] reads back as `c`.
pub fn render_connect(c: &Connect) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    if let Some(k) = &c.connection_key {
        out.append_pair("connectionKey", k);
    }
    if let Some(o) = c.replay_after_offset {
        out.append_pair("replayAfterOffset", &o.to_string());
    }
    if let Some(id) = &c.expected_stream_id {
        out.append_pair("expectedStreamId", id);
    }
    if let Some(g) = c.max_replay_offset_gap {
        out.append_pair("maxReplayOffsetGap", &g.to_string());
    }
    if let Some(types) = &c.event_types {
        out.append_pair("eventTypes", &types.join(","));
    }
    if let Some(condition) = &c.jsonata_condition {
        out.append_pair("jsonataCondition", condition);
    }
    let default = Connect::new();
    if c.events != default.events {
        out.append_pair("events", &c.events.to_string());
    }
    if c.state != default.state {
        out.append_pair("state", &c.state.to_string());
    }
    if c.max_delivery_events != default.max_delivery_events {
        out.append_pair("maxDeliveryEvents", &c.max_delivery_events.to_string());
    }
    if c.max_delivery_bytes != default.max_delivery_bytes {
        out.append_pair("maxDeliveryBytes", &c.max_delivery_bytes.to_string());
    }
    out.finish()
}

/// The query string [`keys_query`] reads back as `q`.
pub fn render_keys(q: &KeysQuery) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    if !q.prefix.is_empty() {
        out.append_pair("prefix", &q.prefix);
    }
    if let Some(after) = &q.after {
        out.append_pair("after", after);
    }
    out.append_pair("limit", &q.limit.to_string());
    out.finish()
}

/// The query string [`effect_query`] reads back as `q`.
pub fn render_effects(q: &EffectFilter) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    if let Some(stream) = &q.stream {
        out.append_pair("stream", stream);
    }
    if let Some(component) = &q.component {
        out.append_pair("component", component);
    }
    if let Some(status) = q.status {
        out.append_pair("status", status.as_str());
    }
    if let Some(ms) = q.due_before_ms {
        out.append_pair(
            "due",
            &format!("before:{}", crate::clock::format_timestamp(ms)),
        );
    }
    if q.after_id > 0 {
        out.append_pair("afterId", &q.after_id.to_string());
    }
    out.append_pair("limit", &q.limit.to_string());
    out.finish()
}

/// The query string [`list_query`] reads back as `q`.
pub fn render_list(q: &StreamsQuery) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    out.append_pair("prefix", &q.prefix);
    if let Some(after) = &q.after_path {
        out.append_pair("afterPath", after);
    }
    out.append_pair("limit", &q.limit.to_string());
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_queries() {
        assert_eq!(
            list_query(None).unwrap(),
            StreamsQuery {
                prefix: "/".into(),
                after_path: None,
                limit: 100
            }
        );
        let q = list_query(Some("prefix=%2Forders&afterPath=%2Forders%2Feu&limit=2")).unwrap();
        assert_eq!(q.prefix, "/orders");
        assert_eq!(q.after_path.as_deref(), Some("/orders/eu"));
        assert_eq!(q.limit, 2);
        for (bad, named) in [
            ("limit=0", "\"0\""),
            ("limit=1001", "\"1001\""),
            ("prefix=orders", "\"orders\""),
            ("x=1", "\"x\""),
        ] {
            let e = list_query(Some(bad)).unwrap_err();
            assert!(e.message.contains(named), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn effect_queries() {
        let q = effect_query(Some(
            "stream=%2Forders%2F.%2Feu&component=totals&status=failed&afterId=7&limit=2",
        ))
        .unwrap();
        assert_eq!(q.stream.as_deref(), Some("/orders/eu"));
        assert_eq!(q.component.as_deref(), Some("totals"));
        assert_eq!(q.status, Some(EffectStatus::Failed));
        assert_eq!((q.after_id, q.limit), (7, 2));
        assert_eq!(effect_query(None).unwrap().limit, 100);
        let due = effect_query(Some("due=before:2026-12-05T00:00:01Z")).unwrap();
        assert_eq!(due.due_before_ms, Some(1_796_428_801_000));
        assert_eq!(effect_query(Some(&render_effects(&due))).unwrap(), due);
        assert_eq!(
            effect_query(Some("due=before:42")).unwrap().due_before_ms,
            Some(42)
        );
        for (bad, named) in [
            ("status=done", "\"done\""),
            ("limit=501", "\"501\""),
            ("afterId=x", "\"x\""),
            ("stream=%2Fa%20b", "/a b"),
            ("x=1", "\"x\""),
            ("due=after:1", "\"after:1\""),
            ("due=before:tomorrow", "\"tomorrow\""),
        ] {
            let e = effect_query(Some(bad)).unwrap_err();
            assert!(e.message.contains(named), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn read_queries() {
        let q = read_query(Some("afterOffset=3&limit=10&includeEphemeral=true")).unwrap();
        assert_eq!(
            (q.after_offset, q.limit, q.include_ephemeral),
            (3, 10, true)
        );
        assert_eq!(read_query(None).unwrap().limit, 500);
        for (bad, named) in [
            ("afterOffset=-1", "\"-1\""),
            ("afterOffset=1.5", "\"1.5\""),
            ("limit=0", "\"0\""),
            ("limit=501", "\"501\""),
            ("includeEphemeral=1", "\"1\""),
            ("x=1", "\"x\""),
        ] {
            let e = read_query(Some(bad)).unwrap_err();
            assert!(e.message.contains(named), "{bad}: {}", e.message);
        }
    }
}
