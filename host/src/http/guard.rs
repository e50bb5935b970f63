//! Checks made before a request reaches its handler (called first by the
//! one middleware, `forward::layer`).
//!
//! Open mode (no tokens) has no credential a web page cannot send, so it
//! refuses what only a browser visiting another site would send: an
//! `Origin` other than this server's own (`403 cross-origin`), and a POST or
//! PUT body that is not `application/json` (`application/wasm` for a
//! component), the content types a cross-site form cannot send without a
//! CORS preflight this server never answers (`415 unsupported-media-type`).
//! It also refuses a `Host` that names neither an IP address nor a loopback
//! name (`localhost`, `*.localhost`) nor one of `[http] allowed-hosts`
//! (`403 host-not-allowed`): a page whose DNS name was pointed at this server
//! (DNS rebinding) sends its own name, and its own `Origin`, which matches.
//!
//! The Durable Streams protocol (`/ds/`) carries any content type, so there
//! only the `Origin` and `Host` checks hold; its CORS preflights (`OPTIONS`,
//! which answer nothing of a stream) are answered whatever their `Origin`.

use axum::http::{header, HeaderMap, Method};

use super::error::ApiError;

/// Whether open mode serves a request whose `Host` is `host` (a name or an
/// IP address, with or without a port).
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        // `[::1]:7410`
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        },
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name.parse::<std::net::IpAddr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
        || allowed
            .iter()
            .any(|a| a.trim_end_matches('.').eq_ignore_ascii_case(&name))
}

/// The open-mode checks of one request (`allowed_hosts`: `[http]
/// allowed-hosts`).
pub fn open_mode(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    allowed_hosts: &[String],
) -> Result<(), ApiError> {
    if let Some(host) = headers.get(header::HOST) {
        let host = host.to_str().unwrap_or("(not text)");
        if !host_allowed(host, allowed_hosts) {
            return Err(ApiError::new(
                403,
                "host-not-allowed",
                format!(
                    "Host {host:?} is neither an IP address nor a loopback name: with no tokens \
                     configured, other names are served only when listed in [http] allowed-hosts \
                     (a web page's DNS name pointed at this server must not reach it)"
                ),
            ));
        }
    }
    let durable = path.starts_with("/ds/");
    if durable && method == Method::OPTIONS {
        return Ok(());
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("(not text)");
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        let own = [format!("http://{host}"), format!("https://{host}")];
        if host.is_empty() || !own.iter().any(|o| o.eq_ignore_ascii_case(origin)) {
            return Err(ApiError::new(
                403,
                "cross-origin",
                format!(
                    "Origin {origin:?} is not this server's own ({host:?}): with no tokens configured, \
                     requests from other sites are refused"
                ),
            ));
        }
    }
    if (method == Method::POST || method == Method::PUT) && has_body(headers) && !durable {
        let wanted = if method == Method::PUT && path.contains("/components/") {
            "application/wasm"
        } else {
            "application/json"
        };
        let given = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let essence = given.split(';').next().unwrap_or("").trim();
        if !essence.eq_ignore_ascii_case(wanted) {
            return Err(ApiError::new(
                415,
                "unsupported-media-type",
                format!(
                    "content type {given:?} is not {wanted}: with no tokens configured, a {method} body must be {wanted}"
                ),
            ));
        }
    }
    Ok(())
}

/// Whether the request says it carries a body.
fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn only_the_servers_own_origin_passes() {
        let get = Method::GET;
        assert!(open_mode(&get, "/x", &headers(&[("host", "127.0.0.1:7410")]), &[]).is_ok());
        assert!(open_mode(
            &get,
            "/x",
            &headers(&[
                ("host", "127.0.0.1:7410"),
                ("origin", "http://127.0.0.1:7410")
            ]),
            &[]
        )
        .is_ok());
        for foreign in ["https://evil.example", "null", "http://127.0.0.1:7411"] {
            let h = {
                let mut h = headers(&[("host", "127.0.0.1:7410")]);
                h.insert("origin", HeaderValue::from_str(foreign).unwrap());
                h
            };
            let e = open_mode(&get, "/x", &h, &[]).unwrap_err();
            assert_eq!((e.status, e.code), (403, "cross-origin"), "{foreign}");
            assert!(e.message.contains(foreign), "{}", e.message);
        }
    }

    #[test]
    fn open_mode_serves_ip_addresses_loopback_names_and_the_allowed_hosts_only() {
        let allowed = ["streams.example.org".to_string()];
        for ok in [
            "127.0.0.1:7410",
            "127.0.0.1",
            "192.168.1.5:7410",
            "[::1]:7410",
            "localhost:7410",
            "LOCALHOST",
            "app.localhost:8080",
            "streams.example.org:7410",
            "streams.example.org.",
        ] {
            assert!(host_allowed(ok, &allowed), "{ok}");
        }
        for refused in [
            "evil.example:7410",
            "localhost.evil.example",
            "example.org",
            "[evil]",
        ] {
            assert!(!host_allowed(refused, &allowed), "{refused}");
        }
        // A rebound page sends its own name as Host and Origin alike.
        let h = headers(&[
            ("host", "evil.example:7410"),
            ("origin", "http://evil.example:7410"),
        ]);
        let e = open_mode(&Method::GET, "/x", &h, &[]).unwrap_err();
        assert_eq!((e.status, e.code), (403, "host-not-allowed"));
        assert!(
            e.message.contains("evil.example:7410") && e.message.contains("allowed-hosts"),
            "{}",
            e.message
        );
        assert!(open_mode(&Method::GET, "/x", &h, &["evil.example".into()]).is_ok());
    }

    #[test]
    fn a_body_must_be_json_or_wasm_for_a_component() {
        let post = Method::POST;
        let json = headers(&[
            ("content-length", "2"),
            ("content-type", "application/json; charset=utf-8"),
        ]);
        assert!(open_mode(&post, "/v1/x", &json, &[]).is_ok());
        let text = headers(&[("content-length", "2"), ("content-type", "text/plain")]);
        let e = open_mode(&post, "/v1/x", &text, &[]).unwrap_err();
        assert_eq!((e.status, e.code), (415, "unsupported-media-type"));
        assert!(open_mode(&post, "/v1/x", &headers(&[("content-length", "0")]), &[]).is_ok());
        let wasm = headers(&[
            ("content-length", "9"),
            ("content-type", "application/wasm"),
        ]);
        assert!(open_mode(&Method::PUT, "/v1/projects/a/components/c", &wasm, &[]).is_ok());
        assert!(open_mode(&Method::PUT, "/v1/projects/a/components/c", &json, &[]).is_err());
        let chunked = headers(&[("transfer-encoding", "chunked")]);
        assert!(open_mode(&post, "/v1/x", &chunked, &[]).is_err());
    }
}
