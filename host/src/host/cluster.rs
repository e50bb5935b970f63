//! The cluster view: this host and every host sharing its database
//! (`GET /v1/cluster` over HTTP).

use serde::Serialize;

use super::Host;
use crate::clock::format_timestamp;
use crate::error::Error;

/// The hosts serving this data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterView {
    /// This host's advertised URL (empty when none is set).
    #[serde(rename = "self")]
    pub this_host: String,
    /// Every host, this one included.
    pub hosts: Vec<ClusterHost>,
}

/// One host of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterHost {
    /// Its advertised URL.
    pub url: String,
    /// Its last lease renewal (RFC 3339; now for a single host).
    pub last_seen_at: String,
    /// Streams it owns (for a single host: those loaded in memory).
    pub streams: u64,
    /// Whether its renewals are within a lease's length (several hosts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live: Option<bool>,
}

impl Host {
    /// This host and every host sharing its database. On SQLite, one host
    /// owning every stream.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// // One host on SQLite: it alone, owning every stream.
    /// let view = host.cluster().await?;
    /// assert_eq!(view.hosts.len(), 1);
    /// # Ok(()) }
    /// ```
    pub async fn cluster(&self) -> Result<ClusterView, Error> {
        let me = self
            .config
            .cluster
            .advertise_url
            .clone()
            .unwrap_or_default();
        if self.streams.storage().cluster().is_none() {
            return Ok(ClusterView {
                this_host: me.clone(),
                hosts: vec![ClusterHost {
                    url: me,
                    last_seen_at: format_timestamp(self.streams.now_ms()),
                    streams: self.streams.actors() as u64,
                    live: None,
                }],
            });
        }
        let hosts = self
            .read_storage("reading the cluster", |s| s.cluster_hosts())
            .await?;
        Ok(ClusterView {
            this_host: me,
            hosts: hosts
                .into_iter()
                .map(|h| ClusterHost {
                    url: h.url,
                    last_seen_at: format_timestamp(h.heartbeat_ms),
                    streams: h.streams,
                    live: Some(h.live),
                })
                .collect(),
        })
    }
}
