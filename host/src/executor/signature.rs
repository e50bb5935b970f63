//! Webhook signatures per the Standard Webhooks scheme
//! (<https://www.standardwebhooks.com>): every webhook POST (a subscription's
//! delivery or a webhook effect) of a project that has a secret carries
//! `webhook-id` (the delivery's or the effect's id, the same on every
//! attempt), `webhook-timestamp` (Unix seconds) and `webhook-signature`:
//! `v1,<base64 of HMAC-SHA256("{id}.{timestamp}.{body}")>` keyed with the
//! secret, one per secret that signs (the current one and, during a
//! rotation, the previous), separated by a space. A secret is `whsec_`
//! followed by the base64 of 32 random bytes. The secrets live in storage
//! (`webhook_secrets`, every host reads the same); each host keeps what it
//! read for a second at most.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use hmac::{KeyInit, Mac};

use crate::delivery::Failure;
use crate::storage::Storage;

/// The prefix of a secret.
const PREFIX: &str = "whsec_";

/// Random bytes in a new secret.
const SECRET_BYTES: usize = 32;

/// How long a host uses what it read of a project's secrets: a rotation on
/// another host signs here within this (the previous secret signs too
/// until it is retired, so a receiver holding either verifies meanwhile).
const CACHED_FOR: Duration = Duration::from_secs(1);

/// The secrets that sign a project's webhooks.
#[derive(Clone)]
pub struct Secrets {
    pub current: String,
    pub previous: Option<String>,
}

impl std::fmt::Debug for Secrets {
    /// Never the secrets themselves.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secrets { .. }")
    }
}

/// A new secret: `whsec_` and the base64 of 32 random bytes.
pub fn generate() -> String {
    let mut bytes = [0u8; SECRET_BYTES];
    getrandom::fill(&mut bytes).expect("the system's random source");
    format!(
        "{PREFIX}{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// `v1,<base64 signature>` of `id`, `timestamp` and `body` under `secret`
/// (`None`: not a secret this host wrote).
fn sign(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Option<String> {
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix(PREFIX)?)
        .ok()?;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).ok()?;
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let signature = mac.finalize().into_bytes();
    Some(format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(signature)
    ))
}

/// The three headers of a signed webhook.
pub fn headers(
    secrets: &Secrets,
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Vec<(&'static str, String)> {
    let signatures: Vec<String> = std::iter::once(&secrets.current)
        .chain(&secrets.previous)
        .filter_map(|s| sign(s, id, timestamp, body))
        .collect();
    vec![
        ("webhook-id", id.to_string()),
        ("webhook-timestamp", timestamp.to_string()),
        ("webhook-signature", signatures.join(" ")),
    ]
}

/// A webhook id as a header carries it: printable ASCII but `\` kept, any
/// other character as `\uXXXX` (a subscription key may be any text).
pub fn header_id(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for c in id.chars() {
        if c.is_ascii_graphic() && c != '\\' {
            out.push(c);
        } else {
            for unit in c.encode_utf16(&mut [0; 2]) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// What one POST is signed with: its id, the project's secrets and the
/// time it is sent at (the host's clock, seconds).
pub struct Signing {
    pub id: String,
    pub secrets: Arc<Secrets>,
    pub timestamp: i64,
}

/// What a host read of a project's secrets, and when.
type Read = (Instant, Option<Arc<Secrets>>);

/// The projects' secrets as this host last read them.
#[derive(Clone, Default)]
pub struct SecretCache {
    read: Arc<Mutex<HashMap<String, Read>>>,
}

impl SecretCache {
    /// `project`'s secrets (blocking on a miss: call it on a blocking
    /// thread); `None` when it has none.
    pub fn get_blocking(
        &self,
        storage: &Storage,
        project: &str,
    ) -> Result<Option<Arc<Secrets>>, Failure> {
        match self.fresh(project) {
            Some(secrets) => Ok(secrets),
            None => self.read_blocking(storage, project),
        }
    }

    /// Reads `project`'s secrets from storage and keeps them (blocking).
    fn read_blocking(
        &self,
        storage: &Storage,
        project: &str,
    ) -> Result<Option<Arc<Secrets>>, Failure> {
        let secrets = storage
            .webhook_secrets(project)
            .map_err(|e| Failure::new(format!("reading the webhook secrets failed: {e:#}"), true))?
            .map(|(current, previous)| Arc::new(Secrets { current, previous }));
        self.read
            .lock()
            .expect("secrets")
            .insert(project.to_string(), (Instant::now(), secrets.clone()));
        Ok(secrets)
    }

    /// What was read of `project` less than [`CACHED_FOR`] ago.
    fn fresh(&self, project: &str) -> Option<Option<Arc<Secrets>>> {
        let read = self.read.lock().expect("secrets");
        let (at, secrets) = read.get(project)?;
        (at.elapsed() < CACHED_FOR).then(|| secrets.clone())
    }

    /// [`SecretCache::get_blocking`] from async code (a blocking thread
    /// only to read storage).
    pub async fn get(
        &self,
        storage: &Storage,
        project: &str,
    ) -> Result<Option<Arc<Secrets>>, Failure> {
        if let Some(secrets) = self.fresh(project) {
            return Ok(secrets);
        }
        let (cache, storage, project) = (self.clone(), storage.clone(), project.to_string());
        super::blocking(move || cache.read_blocking(&storage, &project)).await
    }

    /// Forgets what was read of `project` (its secrets just changed here).
    pub fn forget(&self, project: &str) {
        self.read.lock().expect("secrets").remove(project);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_webhooks_example_signs_as_the_specification_says() {
        // The example of the Standard Webhooks specification.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let signature = sign(
            secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(
            signature.as_deref(),
            Some("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
        );
    }

    #[test]
    fn a_rotation_signs_with_both_secrets_and_a_new_secret_is_random() {
        let (a, b) = (generate(), generate());
        assert!(a.starts_with("whsec_") && a != b);
        let both = Secrets {
            current: b.clone(),
            previous: Some(a.clone()),
        };
        let h = headers(&both, "d1", 7, b"{}");
        assert_eq!(h[0], ("webhook-id", "d1".to_string()));
        assert_eq!(h[1], ("webhook-timestamp", "7".to_string()));
        let expected = format!(
            "{} {}",
            sign(&b, "d1", 7, b"{}").unwrap(),
            sign(&a, "d1", 7, b"{}").unwrap()
        );
        assert_eq!(h[2], ("webhook-signature", expected));
        let one = Secrets {
            current: b,
            previous: None,
        };
        assert_eq!(headers(&one, "d1", 7, b"{}")[2].1.split(' ').count(), 1);
    }

    #[test]
    fn ids_in_headers_are_printable_ascii() {
        assert_eq!(header_id("s1:key:0:7"), "s1:key:0:7");
        assert_eq!(header_id("s1:k é\\:0:7"), "s1:k\\u0020\\u00e9\\u005c:0:7");
    }

    #[test]
    fn a_secret_is_never_printed() {
        let s = Secrets {
            current: generate(),
            previous: None,
        };
        assert!(!format!("{s:?}").contains("whsec_"));
    }
}
