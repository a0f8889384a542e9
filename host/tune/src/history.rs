//! Job history in, jobs out: GitLab's jobs API output (project, group and runner endpoints,
//! one page or many pages concatenated, or JSON lines), a CSV, and Flotilla's own lease
//! history. Every record is read or refused with its line and reason; records that are not
//! demand (never started, still running, other tags) are counted and reported, never dropped
//! in silence.
//!
//! It owns the formats and their checks; it must not know about policies or simulation.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use chrono::{DateTime, Utc};
use serde::Deserialize;

/// One job of the history, in absolute time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Job {
    /// When it became ready for a runner (ms since the epoch).
    pub submit_ms: i64,
    /// How long it ran (ms).
    pub duration_ms: u64,
    /// How long it waited in the real fleet, when the history says (ms).
    pub waited_ms: Option<u64>,
}

/// A read history: jobs by submit time, and what was set aside and why.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// The jobs, ordered by submit time.
    pub jobs: Vec<Job>,
    /// Records that are not demand for this pool, by reason ("never started: skipped", ...).
    pub set_aside: BTreeMap<String, u64>,
    /// The format read.
    pub format: &'static str,
}

/// A refused record: where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// 1-based line of the record (its first line).
    pub line: usize,
    /// Why.
    pub reason: String,
}

/// Why a history could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Records were refused; nothing is used until they are fixed.
    #[error("{path}: {} record(s) refused:\n{}", refusals.len(), list(refusals))]
    Refused {
        /// The file.
        path: String,
        /// The refusals, in file order (at most the first 20 are shown).
        refusals: Vec<Refusal>,
    },
    /// Nothing in the file is a job this pool would have run.
    #[error("{path}: no jobs to tune on{}", aside(set_aside))]
    Empty {
        /// The file.
        path: String,
        /// What was set aside, by reason.
        set_aside: BTreeMap<String, u64>,
    },
}

fn list(refusals: &[Refusal]) -> String {
    let mut out: Vec<String> = refusals
        .iter()
        .take(20)
        .map(|r| format!("  line {}: {}", r.line, r.reason))
        .collect();
    if refusals.len() > 20 {
        out.push(format!("  ... and {} more", refusals.len() - 20));
    }
    out.join("\n")
}

fn aside(set_aside: &BTreeMap<String, u64>) -> String {
    if set_aside.is_empty() {
        return " (the file has no records)".into();
    }
    let parts: Vec<String> = set_aside.iter().map(|(k, n)| format!("{n} {k}")).collect();
    format!(" (set aside: {})", parts.join(", "))
}

/// Which records count as this pool's demand.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only jobs carrying this tag (GitLab `tag_list`, CSV `tags`).
    pub tag: Option<String>,
    /// Only jobs run by this runner (GitLab `runner.id` or `runner.description`).
    pub runner: Option<String>,
    /// Only this pool (Flotilla's lease history).
    pub pool: Option<String>,
    /// The longest span of history read, in days ([`MAX_SPAN_DAYS`] when unset): a longer
    /// one is refused before anything is sized by it.
    pub max_span_days: Option<u32>,
}

/// Reads a history file, telling the format from its content: JSON (GitLab's jobs API or
/// Flotilla's lease history, told apart per record) or CSV.
pub fn read(path: &Path, filter: &Filter) -> Result<History, HistoryError> {
    let display = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| HistoryError::Io {
        path: display.clone(),
        source,
    })?;
    parse(&text, filter).map_err(|e| e.at(&display))
}

/// A parse failure before the file name is known.
#[derive(Debug)]
pub enum ParseError {
    /// Refused records.
    Refused(Vec<Refusal>),
    /// No jobs.
    Empty(BTreeMap<String, u64>),
}

impl ParseError {
    fn at(self, path: &str) -> HistoryError {
        match self {
            ParseError::Refused(refusals) => HistoryError::Refused {
                path: path.into(),
                refusals,
            },
            ParseError::Empty(set_aside) => HistoryError::Empty {
                path: path.into(),
                set_aside,
            },
        }
    }
}

/// Parses a history from text (see [`read`]).
pub fn parse(text: &str, filter: &Filter) -> Result<History, ParseError> {
    let first = text.trim_start().chars().next();
    let mut history = match first {
        Some('[') | Some('{') => parse_json(text, filter)?,
        _ => parse_csv(text, filter)?,
    };
    if history.jobs.is_empty() {
        return Err(ParseError::Empty(std::mem::take(&mut history.set_aside)));
    }
    within_span(&history.jobs, filter.max_span_days.unwrap_or(MAX_SPAN_DAYS))?;
    Ok(history)
}

/// The longest history `tune` replays by default (`--max-history-days`). The replay and its
/// screen keep a sample per minute of the history's span, so two records ten thousand years
/// apart would ask for gigabytes; a year and a month covers any seasonal pattern a policy can
/// follow.
pub const MAX_SPAN_DAYS: u32 = 400;

/// Refuses a history whose jobs, from the first submit to the last end, span more than
/// `max_days`, before anything is sized by it.
fn within_span(jobs: &[Job], max_days: u32) -> Result<(), ParseError> {
    let first = jobs.iter().map(|j| j.submit_ms).min().unwrap_or_default();
    let end = jobs
        .iter()
        .map(|j| {
            j.submit_ms
                .saturating_add(i64::try_from(j.duration_ms).unwrap_or(i64::MAX))
        })
        .max()
        .unwrap_or_default();
    let span_ms = end.saturating_sub(first);
    let max_ms = i64::from(max_days) * 24 * 3_600_000;
    if span_ms <= max_ms {
        return Ok(());
    }
    Err(ParseError::Refused(vec![Refusal {
        line: 1,
        reason: format!(
            "the history spans {} days (from its first submit to its last job's end); tune reads at most {max_days} (--max-history-days): cut the file to the period to tune on, or check the timestamps and durations",
            span_ms / (24 * 3_600_000)
        ),
    }]))
}

/// The 1-based line of byte `offset`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()
        .get(..offset)
        .map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count())
        + 1
}

/// The byte spans of the records: the elements of top-level arrays (pages may follow one
/// another) and top-level objects (JSON lines). An unbalanced document is refused where it
/// breaks.
fn records(text: &str) -> Result<Vec<(usize, usize)>, Refusal> {
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    // The record being read: where it starts, the depth it starts at, and whether it is a
    // container (it ends when its bracket closes) or a bare value (it ends at `,` or `]`).
    let mut record: Option<(usize, usize, bool)> = None;
    let mut open_at = Vec::new();
    for (i, &c) in bytes.iter().enumerate() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            b'"' => {
                in_string = true;
                if depth == 1 && record.is_none() {
                    record = Some((i, 1, false));
                }
            }
            b'[' | b'{' => {
                let element = depth == 1 || (depth == 0 && c == b'{');
                if element && record.is_none() {
                    record = Some((i, depth, true));
                }
                open_at.push(i);
                depth += 1;
            }
            b']' | b'}' => {
                if depth == 0 {
                    return Err(Refusal {
                        line: line_of(text, i),
                        reason: format!("unexpected '{}'", c as char),
                    });
                }
                open_at.pop();
                depth -= 1;
                if let Some(span) = record.and_then(|r| closed(r, depth, i)) {
                    spans.push(span);
                    record = None;
                }
            }
            b',' if depth == 1 => {
                if let Some((s, _, false)) = record {
                    spans.push((s, i));
                    record = None;
                }
            }
            c if c.is_ascii_whitespace() => {}
            _ if depth == 0 => {
                return Err(Refusal {
                    line: line_of(text, i),
                    reason: "expected a JSON array or object here".into(),
                });
            }
            _ if depth == 1 && record.is_none() => record = Some((i, 1, false)),
            _ => {}
        }
    }
    if in_string || depth > 0 {
        let at = open_at.first().copied().unwrap_or(0);
        return Err(Refusal {
            line: line_of(text, at),
            reason: "the JSON opened here is never closed (a truncated download?)".into(),
        });
    }
    Ok(spans)
}

/// The span of the record `(start, depth, container)` that a closing bracket at `i` ends, now
/// that the depth is `depth`: a container at its own depth, or a bare value at the end of
/// its array.
fn closed(
    (start, at, container): (usize, usize, bool),
    depth: usize,
    i: usize,
) -> Option<(usize, usize)> {
    match container {
        true if at == depth => Some((start, i + 1)),
        false if depth == 0 => Some((start, i)),
        _ => None,
    }
}

/// A job as GitLab's jobs API returns it (the fields used).
#[derive(Debug, Deserialize)]
struct GitlabJob {
    id: Option<u64>,
    status: Option<String>,
    created_at: Option<String>,
    started_at: Option<String>,
    finished_at: Option<String>,
    duration: Option<f64>,
    queued_duration: Option<f64>,
    #[serde(default)]
    tag_list: Vec<String>,
    runner: Option<GitlabRunner>,
}

#[derive(Debug, Deserialize)]
struct GitlabRunner {
    id: Option<u64>,
    description: Option<String>,
}

/// A finished lease as `flotilla run` records it (`<state_dir>/history.jsonl`; the fields
/// used, so a later release's extra fields still read).
#[derive(Debug, Deserialize)]
struct LeaseRecord {
    pool: String,
    lease: u64,
    reserved_at_ms: i64,
    acquired_at_ms: Option<i64>,
    released_at_ms: i64,
}

fn timestamp(field: &str, value: &str) -> Result<i64, String> {
    DateTime::parse_from_rfc3339(value)
        .map(|t| t.with_timezone(&Utc).timestamp_millis())
        .map_err(|e| format!("{field} {value:?} is not an RFC 3339 time ({e})"))
}

fn seconds_ms(field: &str, v: f64) -> Result<u64, String> {
    if (0.0..1e10).contains(&v) {
        Ok((v * 1000.0).round() as u64)
    } else {
        Err(format!("{field} {v} is not a duration in seconds"))
    }
}

/// What one record is.
enum Read {
    Job(Job, Option<u64>),
    Aside(String),
}

fn gitlab(job: GitlabJob, filter: &Filter) -> Result<Read, String> {
    if let Some(tag) = &filter.tag
        && !job.tag_list.iter().any(|t| t == tag)
    {
        return Ok(Read::Aside(format!("without tag {tag:?}")));
    }
    if let Some(runner) = &filter.runner {
        let matches = job.runner.as_ref().is_some_and(|r| {
            r.id.is_some_and(|id| id.to_string() == *runner)
                || r.description.as_deref() == Some(runner.as_str())
        });
        if !matches {
            return Ok(Read::Aside(format!(
                "run by another runner than {runner:?}"
            )));
        }
    }
    let Some(started) = job.started_at.as_deref() else {
        let status = job.status.as_deref().unwrap_or("unknown");
        return Ok(Read::Aside(format!("never started (status {status})")));
    };
    let started = timestamp("started_at", started)?;
    let finished = match job.finished_at.as_deref() {
        Some(f) => Some(timestamp("finished_at", f)?),
        None => None,
    };
    let duration_ms = match (job.duration, finished) {
        (Some(d), _) => seconds_ms("duration", d)?,
        (None, Some(f)) if f >= started => (f - started) as u64,
        (None, Some(_)) => return Err("finished_at is before started_at".into()),
        (None, None) => return Ok(Read::Aside("still running".into())),
    };
    // Ready for a runner = started minus the time it was queued; without queued_duration
    // (older GitLab), the creation time is the best bound.
    let (submit_ms, waited_ms) = match job.queued_duration {
        Some(q) => {
            let q = seconds_ms("queued_duration", q)?;
            (started - q as i64, Some(q))
        }
        None => {
            let created = job
                .created_at
                .as_deref()
                .ok_or("neither queued_duration nor created_at is given")?;
            let created = timestamp("created_at", created)?;
            if created > started {
                return Err("created_at is after started_at".into());
            }
            (created, Some((started - created) as u64))
        }
    };
    Ok(Read::Job(
        Job {
            submit_ms,
            duration_ms,
            waited_ms,
        },
        job.id,
    ))
}

fn lease(record: LeaseRecord, filter: &Filter) -> Result<Read, String> {
    if let Some(pool) = &filter.pool
        && record.pool != *pool
    {
        return Ok(Read::Aside(format!("of another pool than {pool:?}")));
    }
    let Some(acquired) = record.acquired_at_ms else {
        return Ok(Read::Aside("reserved but never acquired".into()));
    };
    if acquired < record.reserved_at_ms || record.released_at_ms < acquired {
        return Err(format!(
            "lease {}: times out of order (reserved {}, acquired {acquired}, released {})",
            record.lease, record.reserved_at_ms, record.released_at_ms
        ));
    }
    Ok(Read::Job(
        Job {
            submit_ms: record.reserved_at_ms,
            duration_ms: (record.released_at_ms - acquired) as u64,
            waited_ms: Some((acquired - record.reserved_at_ms) as u64),
        },
        Some(record.lease),
    ))
}

fn parse_json(text: &str, filter: &Filter) -> Result<History, ParseError> {
    let spans = records(text).map_err(|r| ParseError::Refused(vec![r]))?;
    let mut history = History {
        format: "json",
        ..History::default()
    };
    let mut refusals = Vec::new();
    let mut seen = HashSet::new();
    let mut duplicates = 0u64;
    for (start, end) in spans {
        let line = line_of(text, start);
        let raw = text.get(start..end).unwrap_or_default();
        let value: serde_json::Value = match serde_json::from_str(raw) {
            Ok(v) => v,
            Err(e) => {
                refusals.push(Refusal {
                    line: line + e.line().saturating_sub(1),
                    reason: format!("not JSON: {e}"),
                });
                continue;
            }
        };
        let is_lease = value.get("released_at_ms").is_some();
        let read = if is_lease {
            history.format = "flotilla lease history";
            serde_json::from_value::<LeaseRecord>(value)
                .map_err(|e| format!("not a lease record: {e}"))
                .and_then(|r| lease(r, filter))
        } else if value.is_object() {
            history.format = "GitLab jobs API";
            serde_json::from_value::<GitlabJob>(value)
                .map_err(|e| format!("not a GitLab job: {e}"))
                .and_then(|j| gitlab(j, filter))
        } else {
            Err("a record must be a JSON object".into())
        };
        match read {
            Ok(Read::Job(job, id)) => {
                if let Some(id) = id
                    && !seen.insert(id)
                {
                    duplicates += 1;
                    continue;
                }
                history.jobs.push(job);
            }
            Ok(Read::Aside(why)) => *history.set_aside.entry(why).or_default() += 1,
            Err(reason) => refusals.push(Refusal { line, reason }),
        }
    }
    if duplicates > 0 {
        history.set_aside.insert(
            "repeated (the same job id twice: overlapping pages?)".into(),
            duplicates,
        );
    }
    if !refusals.is_empty() {
        return Err(ParseError::Refused(refusals));
    }
    // GitLab lists newest first; the order of the file carries no meaning.
    history.jobs.sort();
    Ok(history)
}

/// CSV: a header naming the columns, then one job per row. Either Flotilla's trace format
/// (`submit_at_s,duration_s[,tag]`: seconds from a start, which is taken as 2026-01-05
/// 00:00 UTC, a Monday) or absolute times (`submit_at` as RFC 3339 or Unix seconds,
/// `duration_s`, optional `waited_s` and `tags` separated by `;`). Rows must be in time order.
fn parse_csv(text: &str, filter: &Filter) -> Result<History, ParseError> {
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let columns = match reader.headers() {
        Ok(h) => Columns::of(&h.iter().map(str::to_string).collect::<Vec<_>>())?,
        Err(e) => {
            return Err(ParseError::Refused(vec![Refusal {
                line: 1,
                reason: e.to_string(),
            }]));
        }
    };
    let mut history = History {
        format: if columns.relative.is_some() {
            "CSV trace (relative)"
        } else {
            "CSV (absolute times)"
        },
        ..History::default()
    };
    let mut refusals = Vec::new();
    let mut last: Option<(i64, usize)> = None;
    for record in reader.records() {
        let record = match record {
            Ok(r) => r,
            Err(e) => {
                let line = e.position().map_or(0, |p| p.line() as usize);
                refusals.push(Refusal {
                    line,
                    reason: e.to_string(),
                });
                continue;
            }
        };
        let line = record.position().map_or(0, |p| p.line() as usize);
        match columns.job(&record, filter) {
            Ok(Some(job)) => {
                if let Some((previous, previous_line)) = last
                    && job.submit_ms < previous
                {
                    refusals.push(Refusal {
                        line,
                        reason: format!(
                            "out of order: submitted {:.1} s before the job on line {previous_line}; sort the file by submit time",
                            (previous - job.submit_ms) as f64 / 1000.0
                        ),
                    });
                    continue;
                }
                last = Some((job.submit_ms, line));
                history.jobs.push(job);
            }
            Ok(None) => {
                let tag = filter.tag.as_deref().unwrap_or_default();
                *history
                    .set_aside
                    .entry(format!("without tag {tag:?}"))
                    .or_default() += 1;
            }
            Err(reason) => refusals.push(Refusal { line, reason }),
        }
    }
    if !refusals.is_empty() {
        return Err(ParseError::Refused(refusals));
    }
    Ok(history)
}

/// Where relative traces start: a Monday, so weekday policies mean something.
const RELATIVE_START_MS: i64 = 1_767_571_200_000;

/// The columns a CSV history's header names.
struct Columns {
    relative: Option<usize>,
    absolute: Option<usize>,
    duration: usize,
    waited: Option<usize>,
    tags: Option<usize>,
}

impl Columns {
    /// The columns of `headers`, or the refusal of a header without a submit time or a
    /// duration.
    fn of(headers: &[String]) -> Result<Columns, ParseError> {
        let column = |name: &str| headers.iter().position(|h| h == name);
        let relative = column("submit_at_s");
        let absolute = column("submit_at");
        let (Some(duration), Some(_)) = (column("duration_s"), relative.or(absolute)) else {
            return Err(ParseError::Refused(vec![Refusal {
                line: 1,
                reason: format!(
                    "the header must name submit_at_s (seconds from the start) or submit_at (RFC 3339 or Unix seconds), and duration_s; it has {}",
                    headers.join(",")
                ),
            }]));
        };
        Ok(Columns {
            relative,
            absolute,
            duration,
            waited: column("waited_s"),
            tags: column("tags").or(column("tag")),
        })
    }

    /// One row's job; `None` for a row the tag filter sets aside.
    fn job(&self, record: &csv::StringRecord, filter: &Filter) -> Result<Option<Job>, String> {
        let field = |i: Option<usize>| i.and_then(|i| record.get(i)).filter(|s| !s.is_empty());
        let number = |name: &str, i: Option<usize>| -> Result<Option<f64>, String> {
            match field(i) {
                None => Ok(None),
                Some(s) => s
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .map(Some)
                    .ok_or(format!("{name} {s:?} is not a number of seconds")),
            }
        };
        if let Some(tag) = &filter.tag {
            let tags = field(self.tags).unwrap_or_default();
            if !tags.split(';').any(|t| t.trim() == tag) {
                return Ok(None);
            }
        }
        let submit_ms = match (self.relative, self.absolute) {
            (Some(i), _) => {
                let s = number("submit_at_s", Some(i))?.ok_or("submit_at_s is empty")?;
                RELATIVE_START_MS + (s * 1000.0).round() as i64
            }
            (None, Some(i)) => {
                let s = field(Some(i)).ok_or("submit_at is empty")?;
                match s.parse::<f64>() {
                    Ok(secs) if secs.is_finite() && secs >= 0.0 => (secs * 1000.0).round() as i64,
                    _ => timestamp("submit_at", s)?,
                }
            }
            (None, None) => return Err("no submit time column".into()),
        };
        let duration = number("duration_s", Some(self.duration))?.ok_or("duration_s is empty")?;
        let waited = number("waited_s", self.waited)?;
        Ok(Some(Job {
            submit_ms,
            duration_ms: seconds_ms("duration_s", duration)?,
            waited_ms: waited.map(|w| (w * 1000.0).round() as u64),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gitlab_job(id: u64, status: &str, started: Option<&str>, queued: Option<f64>) -> String {
        let started = started.map_or("null".to_string(), |s| format!("{s:?}"));
        let queued = queued.map_or("null".to_string(), |q| q.to_string());
        format!(
            r#"{{"id": {id}, "status": "{status}", "created_at": "2026-11-02T09:00:00.000Z",
  "started_at": {started}, "finished_at": null, "duration": 120.5,
  "queued_duration": {queued}, "tag_list": ["docker"],
  "runner": {{"id": 7, "description": "fleet"}}}}"#
        )
    }

    #[test]
    fn gitlab_pages_are_read_newest_first_with_what_is_not_demand_counted() {
        // Two pages as the API returns them (newest first), the second repeating a job.
        let page1 = [
            gitlab_job(3, "success", Some("2026-11-02T09:05:00.000Z"), Some(30.0)),
            gitlab_job(2, "skipped", None, None),
        ]
        .join(",\n");
        let page2 = [
            gitlab_job(2, "skipped", None, None),
            gitlab_job(1, "failed", Some("2026-11-02T09:01:00.000Z"), Some(0.25)),
            gitlab_job(3, "success", Some("2026-11-02T09:05:00.000Z"), Some(30.0)),
        ]
        .join(",\n");
        let text = format!("[{page1}]\n[{page2}]\n");
        let h = parse(&text, &Filter::default()).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(h.format, "GitLab jobs API");
        assert_eq!(h.jobs.len(), 2, "{h:?}");
        // Ready for a runner = started - queued_duration.
        let nine = DateTime::parse_from_rfc3339("2026-11-02T09:00:00Z")
            .map(|t| t.timestamp_millis())
            .unwrap_or(0);
        assert_eq!(h.jobs[0].submit_ms, nine + 60_000 - 250);
        assert_eq!(h.jobs[1].submit_ms, nine + 300_000 - 30_000);
        assert_eq!(h.jobs[1].duration_ms, 120_500);
        assert_eq!(h.jobs[1].waited_ms, Some(30_000));
        assert_eq!(h.set_aside.get("never started (status skipped)"), Some(&2));
        assert_eq!(
            h.set_aside
                .get("repeated (the same job id twice: overlapping pages?)"),
            Some(&1)
        );
    }

    #[test]
    fn a_history_spanning_ten_thousand_years_is_refused_before_anything_is_sized_by_it() {
        let started = std::time::Instant::now();
        // Ten thousand years in Unix seconds, and one job of 285 years.
        let far = "submit_at,duration_s\n1767571200,60\n317330000000,60\n";
        let long_job = "submit_at_s,duration_s\n0,60\n60,9000000000\n";
        for text in [far, long_job] {
            match parse(text, &Filter::default()) {
                Err(ParseError::Refused(r)) => {
                    assert!(r[0].reason.contains("tune reads at most 400"), "{r:?}");
                }
                Err(ParseError::Empty(aside)) => panic!("{text}: set aside {aside:?}"),
                Ok(h) => panic!("{text}: read {} jobs", h.jobs.len()),
            }
        }
        let year = "submit_at_s,duration_s\n0,60\n31536000,60\n";
        assert_eq!(
            parse(year, &Filter::default()).map(|h| h.jobs.len()).ok(),
            Some(2)
        );
        // `--max-history-days` moves the bound both ways.
        let shorter = Filter {
            max_span_days: Some(30),
            ..Filter::default()
        };
        match parse(year, &shorter) {
            Err(ParseError::Refused(r)) => {
                assert!(r[0].reason.contains("spans 365 days"), "{r:?}");
                assert!(
                    r[0].reason.contains("at most 30 (--max-history-days)"),
                    "{r:?}"
                );
            }
            other => panic!("a year with a 30-day bound: {other:?}"),
        }
        let longer = Filter {
            max_span_days: Some(20_000),
            ..Filter::default()
        };
        let decades = "submit_at_s,duration_s\n0,60\n1576800000,60\n";
        assert_eq!(parse(decades, &longer).map(|h| h.jobs.len()).ok(), Some(2));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn a_malformed_gitlab_record_is_refused_with_its_line_and_nothing_is_used() {
        let text = format!(
            "[\n{},\n{}\n]",
            gitlab_job(1, "success", Some("2026-11-02T09:01:00.000Z"), Some(1.0)),
            gitlab_job(2, "success", Some("yesterday"), Some(1.0)),
        );
        match parse(&text, &Filter::default()) {
            Err(ParseError::Refused(r)) => {
                assert_eq!(r.len(), 1, "{r:?}");
                assert_eq!(r[0].line, 6, "{r:?}");
                assert!(r[0].reason.contains("started_at \"yesterday\""), "{r:?}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        match parse("[\n{\"id\": 1,\n", &Filter::default()) {
            Err(ParseError::Refused(r)) => {
                assert_eq!(r[0].line, 1);
                assert!(r[0].reason.contains("never closed"), "{r:?}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_tag_filter_sets_other_jobs_aside_by_name() {
        let text = format!(
            "[{}]",
            gitlab_job(1, "success", Some("2026-11-02T09:01:00.000Z"), Some(1.0))
        );
        let filter = Filter {
            tag: Some("macos".into()),
            ..Filter::default()
        };
        match parse(&text, &filter) {
            Err(ParseError::Empty(aside)) => {
                assert_eq!(aside.get("without tag \"macos\""), Some(&1));
            }
            other => panic!("expected no jobs, got {other:?}"),
        }
    }

    #[test]
    fn csv_rows_out_of_order_or_malformed_are_refused_with_their_lines() {
        let text = "submit_at,duration_s\n2026-11-02T09:00:00Z,60\n2026-11-02T08:00:00Z,60\n2026-11-02T10:00:00Z,minus\n";
        match parse(text, &Filter::default()) {
            Err(ParseError::Refused(r)) => {
                assert_eq!(r.len(), 2, "{r:?}");
                assert_eq!(r[0].line, 3);
                assert!(r[0].reason.contains("out of order"), "{r:?}");
                assert!(r[0].reason.contains("line 2"), "{r:?}");
                assert_eq!(r[1].line, 4);
                assert!(r[1].reason.contains("duration_s \"minus\""), "{r:?}");
            }
            other => panic!("expected refusals, got {other:?}"),
        }
        match parse("when,how_long\n1,2\n", &Filter::default()) {
            Err(ParseError::Refused(r)) => assert!(r[0].reason.contains("submit_at"), "{r:?}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_relative_trace_and_unix_seconds_both_read() {
        let h = parse(
            "submit_at_s,duration_s,tag\n0.5,60,a\n1.25,30,b\n",
            &Filter::default(),
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(h.jobs[1].submit_ms - h.jobs[0].submit_ms, 750);
        let h = parse("submit_at,duration_s\n1793577600,10\n", &Filter::default())
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(h.jobs[0].submit_ms, 1_793_577_600_000);
    }

    #[test]
    fn an_empty_history_says_so() {
        assert!(matches!(
            parse("submit_at,duration_s\n", &Filter::default()),
            Err(ParseError::Empty(_))
        ));
        assert!(matches!(
            parse("[]", &Filter::default()),
            Err(ParseError::Empty(_))
        ));
    }

    #[test]
    fn flotilla_lease_history_reads_and_keeps_its_pool() {
        let text = r#"{"pool":"a","lease":1,"reserved_at_ms":1000,"acquired_at_ms":4000,"released_at_ms":64000,"instance":"i-1"}
{"pool":"b","lease":2,"reserved_at_ms":2000,"acquired_at_ms":2000,"released_at_ms":3000}
{"pool":"a","lease":3,"reserved_at_ms":5000,"acquired_at_ms":null,"released_at_ms":6000}
"#;
        let filter = Filter {
            pool: Some("a".into()),
            ..Filter::default()
        };
        let h = parse(text, &filter).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(h.format, "flotilla lease history");
        assert_eq!(
            h.jobs,
            vec![Job {
                submit_ms: 1000,
                duration_ms: 60_000,
                waited_ms: Some(3000)
            }]
        );
        assert_eq!(h.set_aside.get("reserved but never acquired"), Some(&1));
        assert_eq!(h.set_aside.get("of another pool than \"a\""), Some(&1));
    }
}
