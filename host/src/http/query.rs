//! Query-string parsing with errors that name the bad parameter and value.

use crate::error::ApiError;
use crate::stream::{ReadQuery, READ_LIMIT_MAX};

fn pairs(query: Option<&str>) -> impl Iterator<Item = (&str, &str)> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
}

/// Rejects any query parameter.
pub fn no_query(query: Option<&str>) -> Result<(), ApiError> {
    match pairs(query).next() {
        None => Ok(()),
        Some((name, _)) => Err(ApiError::invalid(format!(
            "unknown query parameter {name:?}"
        ))),
    }
}

/// Parses `afterOffset`, `limit` and `includeEphemeral` of `:events`.
pub fn read_query(query: Option<&str>) -> Result<ReadQuery, ApiError> {
    let mut q = ReadQuery {
        after_offset: 0,
        limit: READ_LIMIT_MAX,
        include_ephemeral: false,
    };
    for (name, value) in pairs(query) {
        match name {
            "afterOffset" => {
                q.after_offset = value.parse::<u64>().map_err(|_| {
                    ApiError::invalid(format!(
                        "afterOffset {value:?} is not a non-negative integer"
                    ))
                })?
            }
            "limit" => {
                q.limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|l| (1..=READ_LIMIT_MAX).contains(l))
                    .ok_or_else(|| {
                        ApiError::invalid(format!(
                            "limit {value:?} is not an integer from 1 to {READ_LIMIT_MAX}"
                        ))
                    })?
            }
            "includeEphemeral" => {
                q.include_ephemeral = match value {
                    "true" => true,
                    "false" => false,
                    other => {
                        return Err(ApiError::invalid(format!(
                            "includeEphemeral {other:?} is not true or false"
                        )))
                    }
                }
            }
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {other:?} for :events"
                )))
            }
        }
    }
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

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
