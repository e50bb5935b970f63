//! Sends one event as a webhook POST (the envelope is `delivery/webhook.rs`).
//! Any 2xx acknowledges. Redirects are never followed (a 3xx is a failure
//! like any other non-2xx answer). With `[webhooks] deny-private-networks`,
//! targets on loopback, private, link-local and other non-public addresses
//! are refused after DNS resolution, and the connection only ever goes to
//! the addresses that passed the check.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::signature::Signing;
use super::{blocking, Attempt};
use crate::delivery::select::Selection;
use crate::delivery::webhook::{body, posted_event, Envelope};
use crate::delivery::Failure;
use crate::jsonata::Expression;

/// Bytes of a failing receiver's answer quoted in the error.
const RESPONSE_QUOTE_BYTES_MAX: usize = 200;

/// The HTTP client of webhooks, built once per host from its configuration.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    deny_private_networks: bool,
    /// `[effects] per-destination-rate`, when set.
    pacer: Option<Arc<Pacer>>,
}

/// Spaces the POSTs to each destination (host name) `interval` apart.
struct Pacer {
    interval: Duration,
    next: std::sync::Mutex<std::collections::HashMap<String, tokio::time::Instant>>,
}

/// Destinations a pacer remembers before it forgets those whose next
/// slot has passed.
const PACED_DESTINATIONS_MAX: usize = 4096;

impl Pacer {
    /// The next slot of `destination`, taken; answers when it is.
    fn take(&self, destination: &str) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        if next.len() >= PACED_DESTINATIONS_MAX {
            next.retain(|_, at| *at > now);
        }
        let slot = next
            .get(destination)
            .copied()
            .filter(|at| *at > now)
            .unwrap_or(now);
        next.insert(destination.to_string(), slot + self.interval);
        slot
    }
}

impl Client {
    pub fn new(deny_private_networks: bool, rate: Option<f64>) -> anyhow::Result<Client> {
        let mut builder = reqwest::Client::builder()
            .user_agent(concat!("streamhost/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none());
        if deny_private_networks {
            builder = builder.dns_resolver(Arc::new(PublicOnly));
        }
        Ok(Client {
            http: builder.build()?,
            deny_private_networks,
            pacer: rate.map(|r| {
                Arc::new(Pacer {
                    interval: Duration::from_secs_f64(1.0 / r),
                    next: Default::default(),
                })
            }),
        })
    }

    /// POSTs one body as [`Client::post_keyed`] does, as a client span
    /// (`webhook POST`) of `parent`'s trace when it is exported: the
    /// request's `traceparent` names that span, so the receiver's own
    /// spans hang under it. Without a span, the request carries `parent`.
    /// With `signing`, the request is signed (`signature.rs`).
    #[allow(clippy::too_many_arguments)]
    pub async fn post_traced(
        &self,
        telemetry: &crate::telemetry::Telemetry,
        parent: Option<&crate::trace::Trace>,
        url: &str,
        body: &Value,
        timeout_ms: u64,
        mut headers: Vec<(&'static str, String)>,
        signing: Option<Signing>,
    ) -> Result<u16, (Failure, Option<u16>)> {
        let span = parent.and_then(|p| telemetry.begin(Some(p)));
        let context = span.as_ref().map(|s| &s.handed_on).or(parent);
        headers.extend(crate::effect::trace_headers(context));
        let sent = self
            .post_keyed(url, body, timeout_ms, &headers, signing.as_ref())
            .await;
        if let Some(span) = span {
            // The URL without its query (which may hold a secret).
            let shown = url.split(['?', '#']).next().unwrap_or(url).to_string();
            let mut record = crate::telemetry::Record::default()
                .with("http.request.method", "POST")
                .with("url.full", shown);
            match &sent {
                Ok(status) => {
                    record = record.with("http.response.status_code", i64::from(*status));
                }
                Err((failure, status)) => {
                    if let Some(status) = status {
                        record = record.with("http.response.status_code", i64::from(*status));
                    }
                    record.error = Some(failure.message.clone());
                }
            }
            telemetry.end(
                span,
                "webhook POST",
                opentelemetry::trace::SpanKind::Client,
                record,
            );
        }
        sent
    }

    /// POSTs one body (JSON) with `headers`, signed with `signing` when
    /// given (the signature covers the bytes sent); answers the receiver's
    /// status. A failure comes with the status the receiver answered, if
    /// it answered.
    pub async fn post_keyed(
        &self,
        url: &str,
        body: &Value,
        timeout_ms: u64,
        headers: &[(&'static str, String)],
        signing: Option<&Signing>,
    ) -> Result<u16, (Failure, Option<u16>)> {
        if self.deny_private_networks {
            check_target(url).await.map_err(|f| (f, None))?;
        }
        let fail = |message: String| Failure::new(message, true);
        // At most `per-destination-rate` POSTs a second to one host name:
        // this one waits for its slot (it holds a place of its destination,
        // so a few wait at once).
        if let (Some(pacer), Some(destination)) = (&self.pacer, super::destination(url)) {
            tokio::time::sleep_until(pacer.take(&destination)).await;
        }
        let bytes = serde_json::to_vec(body).expect("a JSON value serializes");
        let mut request = self
            .http
            .post(url)
            .timeout(Duration::from_millis(timeout_ms))
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        if let Some(s) = signing {
            for (name, value) in super::signature::headers(&s.secrets, &s.id, s.timestamp, &bytes) {
                request = request.header(name, value);
            }
        }
        let request = request.body(bytes);
        let response = request.send().await.map_err(|e| {
            let message = if e.is_timeout() {
                format!("webhook POST to {url} timed out after {timeout_ms}ms")
            } else {
                format!("webhook POST to {url} failed: {}", error_chain(&e))
            };
            // An address refused at connect time is refused again.
            let retryable = !refused_address(&e);
            (Failure::new(message, retryable), None)
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(status.as_u16());
        }
        let code = Some(status.as_u16());
        if status.is_redirection() {
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("nowhere")
                .to_string();
            return Err((
                fail(format!(
                    "webhook responded {} redirecting to {location}: redirects are not followed",
                    status.as_u16()
                )),
                code,
            ));
        }
        // A receiver that is busy or limits its rate says when to come
        // back: the next attempt waits for it (at most the backoff's max).
        let retry_after = match status.as_u16() {
            429 | 503 => response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| retry_after_ms(v, std::time::SystemTime::now())),
            _ => None,
        };
        let text = quoted_body(response).await;
        let mut failure = fail(format!(
            "webhook responded {} {}",
            status.as_u16(),
            text.trim()
        ));
        failure.retry_after_ms = retry_after;
        Err((failure, code))
    }
}

/// A `retry-after` value in ms: delay seconds, or an HTTP date (after
/// `now`; one past is no wait). `None`: not a value of either form.
fn retry_after_ms(value: &str, now: std::time::SystemTime) -> Option<u64> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(seconds.saturating_mul(1000));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).map_or(0, |d| d.as_millis() as u64))
}

/// At most [`RESPONSE_QUOTE_BYTES_MAX`] bytes of a receiver's answer, read
/// no further than that (a receiver's body can be of any size).
async fn quoted_body(mut response: reqwest::Response) -> String {
    let mut bytes: Vec<u8> = Vec::new();
    while bytes.len() < RESPONSE_QUOTE_BYTES_MAX {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            _ => break,
        }
    }
    bytes.truncate(RESPONSE_QUOTE_BYTES_MAX);
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    // A character cut at the end reads as U+FFFD: drop it.
    if text.ends_with('\u{fffd}') && bytes.len() == RESPONSE_QUOTE_BYTES_MAX {
        text.pop();
    }
    text
}

/// Whether a request failed because [`PublicOnly`] refused every address.
fn refused_address(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(s) = source {
        if s.is::<RefusedAddress>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// A name that resolves to no public address.
#[derive(Debug)]
struct RefusedAddress(String);

impl std::fmt::Display for RefusedAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RefusedAddress {}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Sends the one event of `selection`.
pub async fn send(
    Attempt { exec, job, source }: Attempt<'_>,
    selection: Selection,
    url: &str,
    transform: Option<Expression>,
    configured_at: u64,
) -> Result<(), Failure> {
    let event = selection
        .events
        .into_iter()
        .next()
        .expect("a non-empty selection");
    let offset = event.offset;
    // (The delivery attempt's span handed its context to the event.)
    let parent = event.trace.clone();
    let attempt = match job.failing {
        Some((o, n)) if o == offset => n + 1,
        _ => 1,
    };
    let (storage, row_id) = (exec.storage.clone(), source.row_id);
    let event_bytes_max = exec.bounds.event_bytes_max;
    let (key, generation, info) = (job.key.clone(), job.generation, source.info.clone());
    let secrets = exec.secrets.clone();
    // The configure event's read, the transform and the project's signing
    // secrets run off the async workers.
    let (body, secrets) = blocking(move || {
        let secrets = match info.project_id.as_deref() {
            Some(project) => secrets.get_blocking(&storage, project)?,
            None => None,
        };
        let configured = storage
            .events_after(row_id, configured_at.saturating_sub(1), 1, configured_at)
            .map_err(|e| Failure::new(format!("reading the source failed: {e:#}"), true))?;
        let configured_event: Value = configured
            .first()
            .and_then(|(_, body)| serde_json::from_str(body).ok())
            .unwrap_or(Value::Null);
        let posted = posted_event(&event, transform.as_ref(), &key, event_bytes_max)?;
        let envelope = Envelope {
            project_id: info.project_id.as_deref(),
            path: &info.path,
            stream_id: &info.stream_id,
            stream_created_at: &info.stream_created_at,
            subscription_key: &key,
            generation,
            attempt,
            configured_event: &configured_event,
        };
        Ok((body(&envelope, &posted, offset), secrets))
    })
    .await?;
    let signing = secrets.map(|secrets| Signing {
        id: super::signature::header_id(body["deliveryId"].as_str().unwrap_or_default()),
        secrets,
        timestamp: exec.clock.now_ms().div_euclid(1000),
    });
    exec.webhooks
        .post_traced(
            &exec.telemetry,
            parent.as_ref(),
            url,
            &body,
            job.timeout_ms,
            Vec::new(),
            signing,
        )
        .await
        .map(|_| ())
        .map_err(|(failure, _)| failure)
}

/// Refuses a URL whose host is, or resolves to, a non-public address.
async fn check_target(url: &str) -> Result<(), Failure> {
    let refuse = |m: String| Failure::new(m, false);
    let parsed =
        reqwest::Url::parse(url).map_err(|e| refuse(format!("webhook url {url:?}: {e}")))?;
    let host = parsed
        .host_str()
        .ok_or_else(|| refuse(format!("webhook url {url:?} has no host")))?;
    let port = parsed.port_or_known_default().unwrap_or(443);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| Failure::new(format!("resolving {host:?} failed: {e}"), true))?
            .collect(),
    };
    if let Some(bad) = addrs.iter().find(|a| !is_public(a.ip())) {
        return Err(refuse(format!(
            "webhook target {url} resolves to {}, {}: [webhooks] deny-private-networks refuses it",
            bad.ip(),
            kind(bad.ip())
        )));
    }
    Ok(())
}

/// A resolver that answers only public addresses, so a DNS answer that
/// changes after [`check_target`] cannot reach a private network.
struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let public: Vec<SocketAddr> =
                all.iter().copied().filter(|a| is_public(a.ip())).collect();
            if public.is_empty() {
                let e: Box<dyn std::error::Error + Send + Sync> =
                    Box::new(RefusedAddress(format!(
                        "{host} resolves to no public address ([webhooks] deny-private-networks)"
                    )));
                return Err(e);
            }
            let addrs: reqwest::dns::Addrs = Box::new(public.into_iter());
            Ok(addrs)
        })
    }
}

/// Whether `ip` is a public unicast address.
pub fn is_public(ip: IpAddr) -> bool {
    kind(ip) == "a public address"
}

/// What kind of address `ip` is, for messages.
fn kind(ip: IpAddr) -> &'static str {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            if v4.is_loopback() {
                "a loopback address"
            } else if v4.is_private() {
                "a private address"
            } else if v4.is_link_local() {
                "a link-local address"
            } else if v4.is_unspecified() || o[0] == 0 {
                "an unspecified address"
            } else if v4.is_broadcast() || v4.is_multicast() || o[0] >= 240 {
                "a broadcast, multicast or reserved address"
            } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
                "a shared (carrier-grade NAT) address"
            } else if o[0] == 198 && (o[1] & 0xfe) == 18 {
                "a benchmarking address"
            } else {
                "a public address"
            }
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return kind(IpAddr::V4(v4));
            }
            let s = v6.segments();
            let embedded = |hi: u16, lo: u16| {
                std::net::Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8)
            };
            // Forms that carry an IPv4 address: IPv4-compatible (::a.b.c.d),
            // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) are what the IPv4
            // address is.
            let compatible = s[..6] == [0; 6] && !(v6.is_loopback() || v6.is_unspecified());
            let nat64 = s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0; 4];
            let carried = if compatible || nat64 {
                Some(embedded(s[6], s[7]))
            } else if s[0] == 0x2002 {
                Some(embedded(s[1], s[2]))
            } else {
                None
            };
            if let Some(v4) = carried {
                return kind(IpAddr::V4(v4));
            }
            let first = s[0];
            if v6.is_loopback() {
                "a loopback address"
            } else if v6.is_unspecified() {
                "an unspecified address"
            } else if (first & 0xfe00) == 0xfc00 {
                "a private (unique local) address"
            } else if (first & 0xffc0) == 0xfe80 {
                "a link-local address"
            } else if v6.is_multicast() {
                "a broadcast, multicast or reserved address"
            } else if first == 0x64 && s[1] == 0xff9b {
                "a private (local-use NAT64) address"
            } else if first == 0x2001 && s[1] == 0 {
                "a reserved (Teredo) address"
            } else if first == 0x2001 && s[1] == 0x0db8 {
                "a reserved (documentation) address"
            } else if first == 0x0100 && s[1..4] == [0; 3] {
                "a reserved (discard) address"
            } else {
                "a public address"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_pacer_spaces_each_destinations_posts_and_forgets_past_ones() {
        let pacer = Pacer {
            interval: Duration::from_millis(200),
            next: Default::default(),
        };
        let start = tokio::time::Instant::now();
        let slots: Vec<Duration> = (0..3).map(|_| pacer.take("a") - start).collect();
        assert_eq!(
            slots,
            [0, 200, 400].map(Duration::from_millis),
            "one destination's POSTs 200 ms apart"
        );
        assert_eq!(pacer.take("b") - start, Duration::ZERO, "another's at once");
        tokio::time::advance(Duration::from_secs(1)).await;
        let now = tokio::time::Instant::now();
        assert_eq!(pacer.take("a"), now, "a slot long past is no wait");
    }

    #[test]
    fn retry_after_is_seconds_or_an_http_date() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(retry_after_ms("120", now), Some(120_000));
        assert_eq!(retry_after_ms(" 0 ", now), Some(0));
        // 2015-10-21T07:28:00Z is `now`; two minutes later:
        assert_eq!(
            retry_after_ms("Wed, 21 Oct 2015 07:30:00 GMT", now),
            Some(120_000)
        );
        assert_eq!(
            retry_after_ms("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(0),
            "a date past is no wait"
        );
        assert_eq!(retry_after_ms("soon", now), None);
        assert_eq!(retry_after_ms("-5", now), None);
    }

    #[test]
    fn non_public_addresses_are_recognised() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "::10.0.0.1",
            "64:ff9b::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "2002:7f00:1::1",
            "2002:c0a8:101::1",
            "2001::1",
            "2001:db8::1",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in [
            "1.1.1.1",
            "93.184.216.34",
            "2606:4700::1111",
            "172.32.0.1",
            "64:ff9b::1.1.1.1",
            "2002:101:101::1",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[tokio::test]
    async fn literal_and_resolved_private_targets_are_refused_at_once() {
        let e = check_target("http://127.0.0.1:9/hook").await.unwrap_err();
        assert!(!e.retryable);
        assert!(
            e.message.contains("127.0.0.1, a loopback address"),
            "{}",
            e.message
        );
        let e = check_target("http://[::1]:9/hook").await.unwrap_err();
        assert!(e.message.contains("::1"), "{}", e.message);
        let e = check_target("http://localhost:9/hook").await.unwrap_err();
        assert!(e.message.contains("loopback"), "{}", e.message);
    }
}
