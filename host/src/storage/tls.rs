//! TLS for PostgreSQL connections, as the URL's `sslmode` says:
//! `disable` and `prefer` (the default) connect in plain text, as today's
//! loopback and private-network setups expect; `require` encrypts and
//! verifies the server's certificate against the Mozilla roots
//! (`webpki-roots`) and the machine's own trust store, so a server that
//! cannot prove its name is refused rather than trusted blindly.

use postgres::config::SslMode;

/// Opens a client with `config`, with TLS when its `sslmode` requires it.
pub(super) fn connect(config: &postgres::Config) -> Result<postgres::Client, postgres::Error> {
    match config.get_ssl_mode() {
        SslMode::Require => config.connect(connector()),
        _ => config.connect(postgres::NoTls),
    }
}

fn connector() -> tokio_postgres_rustls::MakeRustlsConnect {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::debug!(error = %e, "reading the machine's trust store");
    }
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    tracing::debug!(
        added,
        ignored,
        "PostgreSQL TLS roots from the machine's trust store"
    );
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("ring supports the default TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_postgres_rustls::MakeRustlsConnect::new(config)
}
