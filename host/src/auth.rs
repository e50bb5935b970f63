//! Bearer-token authority: each configured token maps to the projects it may
//! use, or to `admin` (everything, including the global namespace). With no
//! tokens configured the host runs open, for development.

use std::collections::HashSet;
use std::sync::Arc;

use crate::config::{Scope, TokenConfig};
use crate::error::Error;
use crate::stream::Namespace;

/// Who a request acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// An admin token, or any request when the host runs open.
    Admin,
    /// A token limited to these projects.
    Projects(Arc<HashSet<String>>),
    /// A token of scope `append` for these projects: events only.
    Appends(Arc<HashSet<String>>),
}

impl Caller {
    pub fn is_admin(&self) -> bool {
        matches!(self, Caller::Admin)
    }

    /// Checks that the caller may use streams of `namespace`.
    pub fn may_use(&self, namespace: &Namespace) -> Result<(), Error> {
        match (self, namespace) {
            (Caller::Admin, _) => Ok(()),
            (Caller::Projects(ps) | Caller::Appends(ps), Namespace::Project(p))
                if ps.contains(p) =>
            {
                Ok(())
            }
            (_, Namespace::Project(p)) => Err(Error::forbidden(format!(
                "this token may not use project {p:?}"
            ))),
            (_, Namespace::Global) => Err(Error::forbidden(
                "the global namespace needs an admin token",
            )),
        }
    }

    /// The projects a project token may use (`None`: an admin's, all).
    pub fn projects(&self) -> Option<&Arc<HashSet<String>>> {
        match self {
            Caller::Admin => None,
            Caller::Projects(ps) | Caller::Appends(ps) => Some(ps),
        }
    }

    /// Checks that the caller may configure (`what`, the operation, is
    /// named): a token of scope `append` may not (`403
    /// scope-insufficient`).
    pub fn require_configure(&self, what: &str) -> Result<(), Error> {
        match self {
            Caller::Appends(_) => Err(Error::new(
                crate::error::ErrorKind::Forbidden,
                "scope-insufficient",
                format!(
                    "{what} needs a token of scope \"configure\"; this token's scope is \"append\" \
                     (events only)"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Checks that the caller is an admin; `what` names the operation.
    pub fn require_admin(&self, what: &str) -> Result<(), Error> {
        if self.is_admin() {
            Ok(())
        } else {
            Err(Error::forbidden(format!("{what} needs an admin token")))
        }
    }
}

/// The token table: sha256 digests of the tokens, never the tokens
/// themselves, compared in constant time.
#[derive(Clone)]
pub struct Auth {
    tokens: Vec<([u8; 32], Caller)>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

fn digest(token: &str) -> [u8; 32] {
    <sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()).into()
}

/// Equality whose time does not depend on where the inputs differ.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

impl Auth {
    pub fn new(tokens: &[TokenConfig]) -> Auth {
        let tokens = tokens
            .iter()
            .map(|t| {
                let projects = || Arc::new(t.projects.iter().cloned().collect());
                let caller = match (t.admin, t.scope) {
                    (true, _) => Caller::Admin,
                    (false, Scope::Configure) => Caller::Projects(projects()),
                    (false, Scope::Append) => Caller::Appends(projects()),
                };
                (digest(&t.token), caller)
            })
            .collect();
        Auth { tokens }
    }

    /// Whether the host runs without tokens.
    pub fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Resolves an `Authorization` header value.
    pub fn authenticate(&self, header: Option<&str>) -> Result<Caller, Error> {
        if self.is_open() {
            return Ok(Caller::Admin);
        }
        let header = header.ok_or_else(|| {
            Error::unauthorized("missing Authorization header: send \"Bearer <token>\"")
        })?;
        let token = header.strip_prefix("Bearer ").ok_or_else(|| {
            Error::unauthorized("the Authorization header must read \"Bearer <token>\"")
        })?;
        // Every entry is compared, so the time taken tells nothing about
        // which token (or which prefix of one) matched.
        let presented = digest(token.trim());
        let mut found = None;
        for (d, caller) in &self.tokens {
            if constant_time_eq(d, &presented) && found.is_none() {
                found = Some(caller.clone());
            }
        }
        found.ok_or_else(|| Error::unauthorized("unknown token"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn auth() -> Auth {
        Auth::new(&[
            TokenConfig {
                token: "a".into(),
                projects: vec!["acme".into()],
                admin: false,
                scope: Scope::Configure,
            },
            TokenConfig {
                token: "root".into(),
                projects: vec![],
                admin: true,
                scope: Scope::Configure,
            },
            TokenConfig {
                token: "producer".into(),
                projects: vec!["acme".into()],
                admin: false,
                scope: Scope::Append,
            },
        ])
    }

    #[test]
    fn tokens_map_to_projects_or_admin() {
        let a = auth();
        let acme = a.authenticate(Some("Bearer a")).unwrap();
        assert!(acme.may_use(&Namespace::Project("acme".into())).is_ok());
        assert_eq!(
            acme.may_use(&Namespace::Project("other".into()))
                .unwrap_err()
                .kind,
            ErrorKind::Forbidden
        );
        assert_eq!(
            acme.may_use(&Namespace::Global).unwrap_err().kind,
            ErrorKind::Forbidden
        );
        assert!(a.authenticate(Some("Bearer root")).unwrap().is_admin());
        assert_eq!(
            a.authenticate(None).unwrap_err().kind,
            ErrorKind::Unauthorized
        );
        assert_eq!(
            a.authenticate(Some("Bearer nope")).unwrap_err().kind,
            ErrorKind::Unauthorized
        );
        assert_eq!(
            a.authenticate(Some("Basic a")).unwrap_err().kind,
            ErrorKind::Unauthorized
        );
    }

    #[test]
    fn a_token_of_scope_append_uses_its_projects_and_configures_nothing() {
        let a = auth();
        let producer = a.authenticate(Some("Bearer producer")).unwrap();
        assert!(producer.may_use(&Namespace::Project("acme".into())).is_ok());
        assert!(producer
            .may_use(&Namespace::Project("other".into()))
            .is_err());
        let refused = producer.require_configure("deploying").unwrap_err();
        assert_eq!(
            (refused.kind, refused.code),
            (ErrorKind::Forbidden, "scope-insufficient")
        );
        assert!(
            refused.message.contains("\"append\""),
            "{}",
            refused.message
        );
        let configure = a.authenticate(Some("Bearer a")).unwrap();
        assert!(configure.require_configure("deploying").is_ok());
    }

    #[test]
    fn debug_shows_no_token() {
        let shown = format!("{:?}", auth());
        assert!(!shown.contains("root"), "{shown}");
    }

    #[test]
    fn constant_time_eq_compares_every_byte() {
        let a = digest("x");
        let mut b = a;
        assert!(constant_time_eq(&a, &b));
        b[31] ^= 1;
        assert!(!constant_time_eq(&a, &b));
    }

    #[test]
    fn open_mode_admits_everyone() {
        assert!(Auth::new(&[]).authenticate(None).unwrap().is_admin());
    }
}
