//! What several benchmarks share: options, the disk's raw fsync rate, and
//! percentiles. (A directory, so cargo does not take it for a benchmark.)

#![allow(dead_code)]

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// The number after option `name` on the command line, or `default`.
pub fn arg(name: &str, default: f64) -> f64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// 4 KiB writes + fdatasync per second in `dir`, measured for one second.
pub fn fsync_rate(dir: &Path) -> f64 {
    let mut f = std::fs::File::create(dir.join("fsync-probe")).unwrap();
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < Duration::from_secs(1) {
        f.write_all(&[1u8; 4096]).unwrap();
        f.sync_data().unwrap();
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// The `q` quantile (0..=1) of `v`.
pub fn percentile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * q).round() as usize]
}
