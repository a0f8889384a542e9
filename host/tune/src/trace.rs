//! The job trace of `flotilla simulate` (and of `tune --trace`-style what-ifs): CSV rows of
//! `submit_at_s,duration_s[,tag]`, every bad row reported with its row number.

use std::path::Path;

use flotilla_scaler::sim::Job;

/// Why a trace could not be read; row numbers count the header as row 1.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be opened.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Bad rows, each reported.
    #[error("{path}: {}", .rows.join("; "))]
    Rows {
        /// The file.
        path: String,
        /// One message per bad row.
        rows: Vec<String>,
    },
}

/// Reads `submit_at_s,duration_s[,tag]` rows (header required), reporting every bad row.
pub fn read_trace(path: &Path) -> Result<Vec<Job>, TraceError> {
    let display = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
        path: display.clone(),
        source,
    })?;
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(std::io::BufReader::new(file));
    let mut bad = Vec::new();
    match reader.headers() {
        Ok(h) => {
            let names: Vec<&str> = h.iter().collect();
            if names.first() != Some(&"submit_at_s") || names.get(1) != Some(&"duration_s") {
                bad.push(format!(
                    "row 1: header must start with submit_at_s,duration_s (got {})",
                    names.join(",")
                ));
            }
        }
        Err(e) => bad.push(format!("row 1: {e}")),
    }
    let mut jobs = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let row = i + 2;
        let record = match record {
            Ok(r) => r,
            Err(e) => {
                bad.push(format!("row {row}: {e}"));
                continue;
            }
        };
        let num = |n: usize, name: &str| -> Result<f64, String> {
            let v = record
                .get(n)
                .ok_or_else(|| format!("row {row}: missing {name}"))?;
            let x: f64 = v
                .parse()
                .map_err(|_| format!("row {row}: {name} {v:?} is not a number"))?;
            if !x.is_finite() || x < 0.0 {
                return Err(format!("row {row}: {name} must be >= 0 (got {v})"));
            }
            Ok(x)
        };
        match (num(0, "submit_at_s"), num(1, "duration_s")) {
            (Ok(at), Ok(d)) => jobs.push(Job {
                submit_at: (at * 1000.0).round() as u64,
                duration: ((d * 1000.0).round() as u64).max(1),
                tag: record.get(2).filter(|t| !t.is_empty()).map(str::to_string),
            }),
            (a, b) => bad.extend([a.err(), b.err()].into_iter().flatten()),
        }
        if bad.len() > 50 {
            bad.push("(more bad rows not shown)".to_string());
            break;
        }
    }
    if !bad.is_empty() {
        return Err(TraceError::Rows {
            path: display,
            rows: bad,
        });
    }
    jobs.sort_by_key(|j| j.submit_at);
    Ok(jobs)
}

/// Where a trace's time 0 is unless `--start` says: 2026-01-01T00:00:00Z.
pub const DEFAULT_START_MS: u64 = 1_767_225_600_000;
