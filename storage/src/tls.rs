//! TLS for PostgreSQL connections, as the URL's `sslmode` says:
//! `disable` and `prefer` (the default) connect in plain text, as loopback
//! and private-network setups expect; `require` encrypts and verifies the
//! server's certificate and name, against `sslrootcert=FILE` (PEM) when the
//! URL names one (a private CA), else against the Mozilla roots
//! (`webpki-roots`) and the machine's own trust store. A server that cannot
//! prove its name is refused, never trusted blindly.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use postgres::config::SslMode;

/// The URL without its `sslrootcert` parameter (which the PostgreSQL client
/// does not parse), and that parameter's file.
pub(super) fn split_root_cert(url: &str) -> (String, Option<PathBuf>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), None);
    };
    let mut root = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.strip_prefix("sslrootcert=") {
            Some(path) => {
                root = Some(PathBuf::from(path));
                false
            }
            None => true,
        })
        .collect();
    if kept.is_empty() {
        (base.to_string(), root)
    } else {
        (format!("{base}?{}", kept.join("&")), root)
    }
}

/// Opens a client with `config`, with TLS when its `sslmode` requires it.
pub(super) fn connect(
    config: &postgres::Config,
    root_cert: Option<&Path>,
) -> Result<postgres::Client> {
    Ok(match config.get_ssl_mode() {
        SslMode::Require => config.connect(connector(root_cert)?)?,
        _ => config.connect(postgres::NoTls)?,
    })
}

/// Opens an asynchronous client with `config` (TLS as for [`connect`]);
/// its connection runs as a task of the current runtime.
pub(super) async fn connect_async(
    config: &tokio_postgres::Config,
    root_cert: Option<&Path>,
) -> Result<tokio_postgres::Client> {
    fn drive<S, T>(connection: tokio_postgres::Connection<S, T>)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a PostgreSQL connection ended");
            }
        });
    }
    Ok(match config.get_ssl_mode() {
        SslMode::Require => {
            let (client, connection) = config.connect(connector(root_cert)?).await?;
            drive(connection);
            client
        }
        _ => {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
            drive(connection);
            client
        }
    })
}

fn connector(root_cert: Option<&Path>) -> Result<tokio_postgres_rustls::MakeRustlsConnect> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    match root_cert {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| anyhow::anyhow!("{e:?}"))
                .with_context(|| format!("reading sslrootcert {}", path.display()))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            anyhow::ensure!(
                added > 0,
                "sslrootcert {} holds no usable certificate",
                path.display()
            );
        }
        None => {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            let native = rustls_native_certs::load_native_certs();
            for e in &native.errors {
                tracing::debug!(error = %e, "reading the machine's trust store");
            }
            roots.add_parsable_certificates(native.certs);
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS versions")?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslrootcert_is_taken_out_of_the_url_and_the_rest_kept() {
        assert_eq!(
            split_root_cert("postgres://u@h/db"),
            ("postgres://u@h/db".to_string(), None)
        );
        assert_eq!(
            split_root_cert("postgres://u@h/db?sslmode=require&sslrootcert=/etc/ca.pem"),
            (
                "postgres://u@h/db?sslmode=require".to_string(),
                Some(PathBuf::from("/etc/ca.pem"))
            )
        );
        assert_eq!(
            split_root_cert("postgres://u@h/db?sslrootcert=ca.pem"),
            (
                "postgres://u@h/db".to_string(),
                Some(PathBuf::from("ca.pem"))
            )
        );
    }

    #[test]
    fn a_missing_or_empty_root_file_is_named() {
        let e = connector(Some(Path::new("/nonexistent/ca.pem")))
            .err()
            .unwrap();
        assert!(format!("{e:#}").contains("/nonexistent/ca.pem"), "{e:#}");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let e = connector(Some(&empty)).err().unwrap();
        assert!(format!("{e:#}").contains("no usable certificate"), "{e:#}");
    }
}
