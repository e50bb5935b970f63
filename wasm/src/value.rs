//! JSON ↔ WIT values (API.md): arguments and results of dynamic ITX calls.
//! Errors name the value's path (`args[0].events[2].offset`) and the type
//! that was expected.

use serde_json::{json, Map, Number, Value};
use wasmtime::component::{Type, Val};

/// A value that does not fit its WIT type.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

fn mismatch(path: &str, expected: &str, got: &Value) -> Mismatch {
    let mut shown = got.to_string();
    if shown.len() > 80 {
        shown.truncate(77);
        shown.push_str("...");
    }
    Mismatch {
        path: path.to_string(),
        message: format!("expected {expected}, got {shown}"),
    }
}

/// `kebab-case` → `camelCase`.
pub fn camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '-' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// A short name of a WIT type for error messages.
pub fn type_name(ty: &Type) -> String {
    match ty {
        Type::Bool => "bool".into(),
        Type::S8 => "s8".into(),
        Type::U8 => "u8".into(),
        Type::S16 => "s16".into(),
        Type::U16 => "u16".into(),
        Type::S32 => "s32".into(),
        Type::U32 => "u32".into(),
        Type::S64 => "s64".into(),
        Type::U64 => "u64".into(),
        Type::Float32 => "f32".into(),
        Type::Float64 => "f64".into(),
        Type::Char => "char".into(),
        Type::String => "string".into(),
        Type::List(l) => format!("list<{}>", type_name(&l.ty())),
        Type::Record(_) => "record (object)".into(),
        Type::Tuple(t) => format!(
            "tuple<{}>",
            t.types()
                .map(|t| type_name(&t))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Type::Variant(_) => "variant ({\"case\": payload})".into(),
        Type::Enum(e) => format!("enum ({})", e.names().collect::<Vec<_>>().join(" | ")),
        Type::Option(o) => format!("option<{}>", type_name(&o.ty())),
        Type::Result(_) => "result ({\"ok\": v} or {\"err\": e})".into(),
        Type::Flags(f) => format!("flags ({})", f.names().collect::<Vec<_>>().join(", ")),
        _ => "an unsupported type (resources, streams and futures are refused)".into(),
    }
}

fn int<T: TryFrom<i128>>(v: &Value, path: &str, ty: &Type) -> Result<T, Mismatch> {
    let n = v
        .as_i64()
        .map(i128::from)
        .or_else(|| v.as_u64().map(i128::from))
        .ok_or_else(|| mismatch(path, &format!("an integer ({})", type_name(ty)), v))?;
    T::try_from(n).map_err(|_| {
        mismatch(
            path,
            &format!("an integer in the range of {}", type_name(ty)),
            v,
        )
    })
}

fn float(v: &Value, path: &str) -> Result<f64, Mismatch> {
    match v {
        Value::Number(n) => n.as_f64().ok_or_else(|| mismatch(path, "a number", v)),
        Value::String(s) if s == "NaN" => Ok(f64::NAN),
        Value::String(s) if s == "Infinity" => Ok(f64::INFINITY),
        Value::String(s) if s == "-Infinity" => Ok(f64::NEG_INFINITY),
        _ => Err(mismatch(
            path,
            "a number (or \"NaN\", \"Infinity\", \"-Infinity\")",
            v,
        )),
    }
}

/// Options of the JSON → WIT mapping.
#[derive(Debug, Clone, Copy, Default)]
pub struct ToVal {
    /// Ignore object fields a record does not have (batches built by the host).
    pub ignore_unknown_fields: bool,
}

/// Maps JSON onto a WIT type.
pub fn to_val(v: &Value, ty: &Type, path: &str, opts: ToVal) -> Result<Val, Mismatch> {
    Ok(match ty {
        Type::Bool => Val::Bool(v.as_bool().ok_or_else(|| mismatch(path, "a boolean", v))?),
        Type::S8 => Val::S8(int(v, path, ty)?),
        Type::U8 => Val::U8(int(v, path, ty)?),
        Type::S16 => Val::S16(int(v, path, ty)?),
        Type::U16 => Val::U16(int(v, path, ty)?),
        Type::S32 => Val::S32(int(v, path, ty)?),
        Type::U32 => Val::U32(int(v, path, ty)?),
        Type::S64 => Val::S64(int(v, path, ty)?),
        Type::U64 => Val::U64(int(v, path, ty)?),
        Type::Float32 => Val::Float32(float(v, path)? as f32),
        Type::Float64 => Val::Float64(float(v, path)?),
        Type::Char => {
            let s = v
                .as_str()
                .ok_or_else(|| mismatch(path, "a one-character string", v))?;
            let mut chars = s.chars();
            match (chars.next(), chars.next()) {
                (Some(c), None) => Val::Char(c),
                _ => return Err(mismatch(path, "a one-character string", v)),
            }
        }
        Type::String => Val::String(
            v.as_str()
                .ok_or_else(|| mismatch(path, "a string", v))?
                .to_string(),
        ),
        Type::List(l) => {
            let items = v
                .as_array()
                .ok_or_else(|| mismatch(path, &type_name(ty), v))?;
            let item_ty = l.ty();
            Val::List(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, x)| to_val(x, &item_ty, &format!("{path}[{i}]"), opts))
                    .collect::<Result<_, _>>()?,
            )
        }
        Type::Tuple(t) => {
            let items = v
                .as_array()
                .ok_or_else(|| mismatch(path, &type_name(ty), v))?;
            if items.len() != t.types().len() {
                return Err(mismatch(
                    path,
                    &format!("{} (an array of {})", type_name(ty), t.types().len()),
                    v,
                ));
            }
            Val::Tuple(
                items
                    .iter()
                    .zip(t.types())
                    .enumerate()
                    .map(|(i, (x, ty))| to_val(x, &ty, &format!("{path}[{i}]"), opts))
                    .collect::<Result<_, _>>()?,
            )
        }
        Type::Record(r) => {
            let obj = v
                .as_object()
                .ok_or_else(|| mismatch(path, "a record (object)", v))?;
            let mut fields = Vec::new();
            let mut used = 0;
            for f in r.fields() {
                let camel_name = camel(f.name);
                let value = obj.get(&camel_name).or_else(|| obj.get(f.name));
                if value.is_some() {
                    used += 1;
                }
                let at = format!("{path}.{camel_name}");
                let val = match (value, &f.ty) {
                    (Some(x), ty) => to_val(x, ty, &at, opts)?,
                    (None, Type::Option(_)) => Val::Option(None),
                    (None, ty) => {
                        return Err(Mismatch {
                            path: at,
                            message: format!("missing field of type {}", type_name(ty)),
                        })
                    }
                };
                fields.push((f.name.to_string(), val));
            }
            if !opts.ignore_unknown_fields && used < obj.len() {
                let known: Vec<String> = r
                    .fields()
                    .flat_map(|f| [camel(f.name), f.name.to_string()])
                    .collect();
                let unknown = obj
                    .keys()
                    .find(|k| !known.contains(k))
                    .cloned()
                    .unwrap_or_default();
                return Err(Mismatch {
                    path: format!("{path}.{unknown}"),
                    message: "unknown field".into(),
                });
            }
            Val::Record(fields)
        }
        Type::Variant(var) => {
            let (case, payload) = single_entry(v, path, "a variant ({\"case\": payload})")?;
            let c = var.cases().find(|c| c.name == case).ok_or_else(|| {
                mismatch(
                    path,
                    &format!(
                        "a variant case ({})",
                        var.cases().map(|c| c.name).collect::<Vec<_>>().join(" | ")
                    ),
                    v,
                )
            })?;
            let at = format!("{path}.{case}");
            let payload = match (&c.ty, payload) {
                (None, Value::Null) => None,
                (None, other) => {
                    return Err(mismatch(&at, "null (the case has no payload)", other))
                }
                (Some(ty), x) => Some(Box::new(to_val(x, ty, &at, opts)?)),
            };
            Val::Variant(case.to_string(), payload)
        }
        Type::Enum(e) => {
            let s = v
                .as_str()
                .ok_or_else(|| mismatch(path, &type_name(ty), v))?;
            if !e.names().any(|n| n == s) {
                return Err(mismatch(path, &type_name(ty), v));
            }
            Val::Enum(s.to_string())
        }
        Type::Option(o) => match v {
            Value::Null => Val::Option(None),
            x => Val::Option(Some(Box::new(to_val(x, &o.ty(), path, opts)?))),
        },
        Type::Result(r) => {
            let (case, payload) = single_entry(v, path, "a result ({\"ok\": v} or {\"err\": e})")?;
            let side = |t: Option<Type>, at: String| -> Result<Option<Box<Val>>, Mismatch> {
                match (t, payload) {
                    (None, Value::Null) => Ok(None),
                    (None, other) => Err(mismatch(&at, "null", other)),
                    (Some(t), x) => Ok(Some(Box::new(to_val(x, &t, &at, opts)?))),
                }
            };
            match case {
                "ok" => Val::Result(Ok(side(r.ok(), format!("{path}.ok"))?)),
                "err" => Val::Result(Err(side(r.err(), format!("{path}.err"))?)),
                _ => return Err(mismatch(path, "a result ({\"ok\": v} or {\"err\": e})", v)),
            }
        }
        Type::Flags(f) => {
            let items = v
                .as_array()
                .ok_or_else(|| mismatch(path, &type_name(ty), v))?;
            let mut out = Vec::new();
            for (i, x) in items.iter().enumerate() {
                let s = x.as_str().filter(|s| f.names().any(|n| n == *s));
                out.push(
                    s.ok_or_else(|| mismatch(&format!("{path}[{i}]"), &type_name(ty), x))?
                        .to_string(),
                );
            }
            Val::Flags(out)
        }
        other => {
            return Err(Mismatch {
                path: path.to_string(),
                message: format!("{} cannot be passed as JSON", type_name(other)),
            })
        }
    })
}

fn single_entry<'a>(
    v: &'a Value,
    path: &str,
    expected: &str,
) -> Result<(&'a str, &'a Value), Mismatch> {
    match v.as_object() {
        Some(o) if o.len() == 1 => {
            let (k, x) = o.iter().next().expect("one entry");
            Ok((k.as_str(), x))
        }
        _ => Err(mismatch(path, expected, v)),
    }
}

fn float_json(f: f64) -> Value {
    if f.is_nan() {
        json!("NaN")
    } else if f.is_infinite() {
        json!(if f > 0.0 { "Infinity" } else { "-Infinity" })
    } else {
        Number::from_f64(f)
            .map(Value::Number)
            .unwrap_or(Value::Null)
    }
}

/// Maps a WIT value back to JSON (records with camelCase field names).
pub fn to_json(v: &Val) -> Value {
    match v {
        Val::Bool(b) => json!(b),
        Val::S8(n) => json!(n),
        Val::U8(n) => json!(n),
        Val::S16(n) => json!(n),
        Val::U16(n) => json!(n),
        Val::S32(n) => json!(n),
        Val::U32(n) => json!(n),
        Val::S64(n) => json!(n),
        Val::U64(n) => json!(n),
        Val::Float32(f) => float_json(*f as f64),
        Val::Float64(f) => float_json(*f),
        Val::Char(c) => json!(c.to_string()),
        Val::String(s) => json!(s),
        Val::List(items) | Val::Tuple(items) | Val::FixedLengthList(items) => {
            Value::Array(items.iter().map(to_json).collect())
        }
        Val::Record(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| (camel(k), to_json(v)))
                .collect::<Map<_, _>>(),
        ),
        Val::Variant(case, payload) => {
            json!({ case.clone(): payload.as_deref().map(to_json).unwrap_or(Value::Null) })
        }
        Val::Enum(s) => json!(s),
        Val::Option(o) => o.as_deref().map(to_json).unwrap_or(Value::Null),
        Val::Result(Ok(v)) => json!({"ok": v.as_deref().map(to_json).unwrap_or(Value::Null)}),
        Val::Result(Err(e)) => json!({"err": e.as_deref().map(to_json).unwrap_or(Value::Null)}),
        Val::Flags(f) => json!(f),
        Val::Map(entries) => Value::Array(
            entries
                .iter()
                .map(|(k, v)| json!([to_json(k), to_json(v)]))
                .collect(),
        ),
        Val::Resource(_) | Val::Future(_) | Val::Stream(_) | Val::ErrorContext(_) => {
            json!("<resource>")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camel_case() {
        assert_eq!(camel("process-event-batch"), "processEventBatch");
        assert_eq!(camel("x"), "x");
    }

    #[test]
    fn scalars_both_ways() {
        assert_eq!(
            to_val(&json!(7), &Type::U8, "a", ToVal::default()).unwrap(),
            Val::U8(7)
        );
        let e = to_val(&json!(300), &Type::U8, "args[0]", ToVal::default()).unwrap_err();
        assert_eq!(e.path, "args[0]");
        assert!(e.message.contains("range of u8"), "{}", e.message);
        assert!(to_val(&json!(-1), &Type::U32, "a", ToVal::default()).is_err());
        assert!(to_val(&json!(1.5), &Type::S32, "a", ToVal::default()).is_err());
        assert!(matches!(
            to_val(&json!("NaN"), &Type::Float64, "a", ToVal::default()).unwrap(),
            Val::Float64(f) if f.is_nan()
        ));
        assert_eq!(to_json(&Val::Float64(f64::INFINITY)), json!("Infinity"));
        assert_eq!(to_json(&Val::Float32(1.5)), json!(1.5));
        assert_eq!(
            to_val(&json!("é"), &Type::Char, "a", ToVal::default()).unwrap(),
            Val::Char('é')
        );
        assert!(to_val(&json!("ab"), &Type::Char, "a", ToVal::default()).is_err());
        assert_eq!(to_json(&Val::Char('x')), json!("x"));
    }
}
