//! How answers print: pretty or compact JSON, or a table for people.

use super::*;

/// A JSON value as the output style wants it.
pub(super) fn render(v: &Value) -> String {
    match OUTPUT.get().copied().unwrap_or(Output::Json) {
        Output::Pretty => serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()),
        Output::Json => v.to_string(),
        Output::Table => table(v),
    }
}

/// Widest cell of a table, in characters; longer values are cut with `…`.
pub(super) const TABLE_CELL_CHARS_MAX: usize = 60;

/// A value as one table cell: text as it is, `null` as nothing, the rest
/// as compact JSON; cut at [`TABLE_CELL_CHARS_MAX`].
pub(super) fn cell(v: &Value) -> String {
    let text = match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let text = text.replace('\n', " ");
    if text.chars().count() <= TABLE_CELL_CHARS_MAX {
        return text;
    }
    let cut: String = text.chars().take(TABLE_CELL_CHARS_MAX - 1).collect();
    format!("{cut}…")
}

/// Rows of objects as an aligned table: a header of their keys (in the
/// order first seen) and a line per row.
pub(super) fn rows_table(rows: &[Value]) -> String {
    let mut columns: Vec<String> = Vec::new();
    for r in rows {
        for k in r.as_object().into_iter().flat_map(|o| o.keys()) {
            if !columns.contains(k) {
                columns.push(k.clone());
            }
        }
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| columns.iter().map(|c| cell(&r[c.as_str()])).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            cells
                .iter()
                .map(|r| r[i].chars().count())
                .chain([c.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |values: &[String]| {
        let padded: Vec<String> = values
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    let mut out = vec![line(&columns)];
    out.extend(cells.iter().map(|r| line(r)));
    out.join("\n")
}

/// A field of an answer as table rows, if it is a list of objects (rows),
/// a map of objects (a row each, its key first: `:runtime`'s
/// subscriptions) or one object (one row); `None` for a plain value.
pub(super) fn as_rows(v: &Value) -> Option<Vec<Value>> {
    match v {
        Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_object) => Some(a.clone()),
        Value::Object(m) if !m.is_empty() && m.values().all(Value::is_object) => Some(
            m.iter()
                .map(|(k, row)| {
                    let mut keyed = serde_json::Map::new();
                    keyed.insert("key".into(), json!(k));
                    keyed.extend(
                        row.as_object()
                            .into_iter()
                            .flatten()
                            .map(|(a, b)| (a.clone(), b.clone())),
                    );
                    Value::Object(keyed)
                })
                .collect(),
        ),
        Value::Object(m) if !m.is_empty() => Some(vec![v.clone()]),
        _ => None,
    }
}

/// An answer as a table: the plain fields as aligned `key  value` lines
/// first, then every field that holds objects (streams, components,
/// effects, versions, keys, halts, subscriptions, an event) as rows under
/// its name.
pub(super) fn table(v: &Value) -> String {
    let Some(fields) = v.as_object() else {
        return match as_rows(v) {
            Some(rows) => rows_table(&rows),
            None => cell(v),
        };
    };
    let plain: Vec<(&String, &Value)> = fields
        .iter()
        .filter(|(_, v)| as_rows(v).is_none())
        .collect();
    let width = plain
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let mut out: Vec<String> = plain
        .iter()
        .map(|(k, v)| format!("{k:<width$}  {}", cell(v)).trim_end().to_string())
        .collect();
    for (k, rows) in fields.iter().filter_map(|(k, v)| Some((k, as_rows(v)?))) {
        if !out.is_empty() {
            out.push(String::new());
        }
        out.push(format!("{k}:"));
        out.push(rows_table(&rows));
    }
    out.join("\n")
}
