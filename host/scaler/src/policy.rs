//! Idle policies on cron schedules, with GitLab Runner's `[[runners.autoscaler.policy]]` keys.

use std::str::FromStr;

use chrono::{Offset, TimeZone, Timelike};
use chrono_tz::Tz;
use croner::Cron;

use super::Millis;

/// One `[[policy]]` block, validated.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The cron expressions (5 fields) during whose minutes this policy applies.
    pub periods: Vec<String>,
    crons: Vec<Cron>,
    /// The zone the periods are evaluated in.
    pub timezone: Tz,
    /// Job slots to keep idle (not machines).
    pub idle_count: u32,
    /// How long an unused instance may stay before it is removed (unless idle_count needs it).
    pub idle_time_ms: Millis,
    /// Extra idle slots as a factor of slots in use.
    pub scale_factor: f64,
    /// Upper bound for the extra idle slots from `scale_factor` (0 = none).
    pub scale_factor_limit: u32,
    /// Only hand out reservations when an idle ready slot exists.
    pub preemptive_mode: bool,
}

impl Policy {
    /// Builds a policy, returning every problem with its key name.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        periods: Vec<String>,
        timezone: &str,
        idle_count: u32,
        idle_time_ms: Millis,
        scale_factor: f64,
        scale_factor_limit: u32,
        preemptive_mode: bool,
    ) -> Result<Policy, Vec<(String, String)>> {
        let mut problems = Vec::new();
        let mut crons = Vec::new();
        if periods.is_empty() {
            problems.push((
                "periods".to_string(),
                "must list at least one cron expression".to_string(),
            ));
        }
        for (i, p) in periods.iter().enumerate() {
            match parse_cron(p) {
                Ok(c) => crons.push(c),
                Err(e) => problems.push((format!("periods[{i}]"), e)),
            }
        }
        let tz = match Tz::from_str(timezone) {
            Ok(tz) => tz,
            Err(_) => {
                problems.push((
                    "timezone".to_string(),
                    format!("unknown timezone {timezone:?} (use an IANA name such as Europe/Berlin or UTC)"),
                ));
                Tz::UTC
            }
        };
        if !scale_factor.is_finite() || scale_factor < 0.0 {
            problems.push((
                "scale_factor".to_string(),
                "must be a number >= 0".to_string(),
            ));
        }
        if problems.is_empty() {
            Ok(Policy {
                periods,
                crons,
                timezone: tz,
                idle_count,
                idle_time_ms,
                scale_factor,
                scale_factor_limit,
                preemptive_mode,
            })
        } else {
            Err(problems)
        }
    }

    /// The default when no policy matches: nothing idle, remove unused instances promptly.
    pub fn fallback() -> Policy {
        Policy {
            periods: vec!["* * * * *".to_string()],
            crons: Vec::new(),
            timezone: Tz::UTC,
            idle_count: 0,
            idle_time_ms: 0,
            scale_factor: 0.0,
            scale_factor_limit: 0,
            preemptive_mode: false,
        }
    }

    /// Whether `now` falls in one of the periods (evaluated at minute resolution in `timezone`).
    pub fn matches(&self, now: Millis) -> bool {
        self.match_window(now).0
    }

    /// Whether `now` matches, and the span `[from, until)` (ms) over which that answer cannot
    /// change: the local minute around `now`, or only the current second when the zone's offset
    /// changes within that minute (or the time cannot be placed in the zone).
    fn match_window(&self, now: Millis) -> (bool, Millis, Millis) {
        let this_second = (
            now / 1000 * 1000,
            (now / 1000).saturating_add(1).saturating_mul(1000),
        );
        let secs = i64::try_from(now / 1000).unwrap_or(i64::MAX);
        let Some(local) = self.timezone.timestamp_opt(secs, 0).single() else {
            return (false, this_second.0, this_second.1);
        };
        let Some(t) = local.with_second(0) else {
            return (false, this_second.0, this_second.1);
        };
        let matched = self
            .crons
            .iter()
            .any(|c| c.is_time_matching(&t).unwrap_or(false));
        // Every instant of this local minute evaluates the same local time `t`, as long as the
        // offset to UTC stays the same over it.
        let minute_start = secs - i64::from(local.second());
        let same_offset = self
            .timezone
            .timestamp_opt(minute_start.saturating_add(59), 0)
            .single()
            .is_some_and(|end| end.offset().fix() == local.offset().fix());
        match (same_offset, u64::try_from(minute_start)) {
            (true, Ok(start)) => (matched, start * 1000, (start + 60) * 1000),
            _ => (matched, this_second.0, this_second.1),
        }
    }

    /// Idle slots wanted when `in_use` slots are busy.
    pub fn idle_target(&self, in_use: u32) -> u32 {
        let mut extra = (f64::from(in_use) * self.scale_factor).ceil();
        if self.scale_factor_limit > 0 {
            extra = extra.min(f64::from(self.scale_factor_limit));
        }
        // `extra` is finite and non-negative (validated), and clamped to u32 range.
        let extra = extra.clamp(0.0, f64::from(u32::MAX)) as u32;
        self.idle_count.max(extra)
    }
}

fn parse_cron(p: &str) -> Result<Cron, String> {
    let fields: Vec<&str> = p.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "{p:?} has {} fields; expected 5 (minute hour day month weekday)",
            fields.len()
        ));
    }
    for (field, (name, range)) in fields.iter().zip(&CRON_FIELDS) {
        check_cron_field(field, name, range).map_err(|why| format!("{p:?}: {why}"))?;
    }
    // croner's own words name its internals ("Component error: ..."); ours name the field.
    Cron::from_str(p).map_err(|_| {
        format!("{p:?} is not a cron expression (minute hour day month weekday, e.g. \"* 8-18 * * MON-FRI\")")
    })
}

/// The five fields: their names and ranges, with the names a value may take instead.
const CRON_FIELDS: [(&str, CronRange); 5] = [
    (
        "minute",
        CronRange {
            min: 0,
            max: 59,
            names: &[],
        },
    ),
    (
        "hour",
        CronRange {
            min: 0,
            max: 23,
            names: &[],
        },
    ),
    (
        "day of month",
        CronRange {
            min: 1,
            max: 31,
            names: &[],
        },
    ),
    (
        "month",
        CronRange {
            min: 1,
            max: 12,
            names: &[
                "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
            ],
        },
    ),
    (
        "weekday",
        CronRange {
            min: 0,
            max: 7,
            names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
        },
    ),
];

struct CronRange {
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

impl CronRange {
    fn describe(&self) -> String {
        match (self.names.first(), self.names.last()) {
            (Some(first), Some(last)) => {
                format!("{}-{} or {first}-{last}", self.min, self.max)
            }
            _ => format!("{}-{}", self.min, self.max),
        }
    }

    /// One value of the field: a number in range or a name.
    fn value(&self, text: &str, name: &str) -> Result<(), String> {
        if let Ok(n) = text.parse::<u32>() {
            return if (self.min..=self.max).contains(&n) {
                Ok(())
            } else {
                Err(format!("{name} {n} is out of range ({})", self.describe()))
            };
        }
        if self.names.iter().any(|n| n.eq_ignore_ascii_case(text)) {
            return Ok(());
        }
        Err(format!(
            "{name} {text:?} is not a value ({})",
            self.describe()
        ))
    }
}

/// One field: `*`, values, ranges and steps, comma-separated. Day-of-month and weekday
/// modifiers (`L`, `W`, `#`) are left to the parser.
fn check_cron_field(field: &str, name: &str, range: &CronRange) -> Result<(), String> {
    for part in field.split(',') {
        if part.contains(['L', 'W', '#', '?']) && name != "month" {
            continue;
        }
        let (span, step) = match part.split_once('/') {
            Some((span, step)) => (span, Some(step)),
            None => (part, None),
        };
        if let Some(step) = step
            && !step.parse::<u32>().is_ok_and(|s| s >= 1)
        {
            return Err(format!(
                "{name} step {step:?} must be a whole number of at least 1"
            ));
        }
        if span == "*" {
            continue;
        }
        match span.split_once('-') {
            Some((from, to)) => {
                range.value(from, name)?;
                range.value(to, name)?;
            }
            None => range.value(span, name)?,
        }
    }
    Ok(())
}

/// The policy in force at `now`: the last matching one wins.
pub fn active(policies: &[Policy], now: Millis) -> Option<&Policy> {
    policies.iter().rev().find(|p| p.matches(now))
}

/// Which policy is in force at `now` (its index, `None` for the fallback), and the span
/// `[from, until)` of virtual time over which that answer holds, so callers can evaluate the
/// cron expressions once per minute instead of once per event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ActiveWindow {
    /// Index into the policies, `None` when none matches.
    pub index: Option<usize>,
    /// First instant (ms) of the span.
    pub from: Millis,
    /// First instant (ms) after the span.
    pub until: Millis,
}

impl ActiveWindow {
    /// Whether the answer is known to hold at `now`.
    pub fn covers(&self, now: Millis) -> bool {
        self.from <= now && now < self.until
    }
}

/// [`active`] with the span over which its answer holds: the intersection of the spans of every
/// policy looked at (a later policy starting to match, or the found one ceasing to, changes it).
pub(crate) fn active_window(policies: &[Policy], now: Millis) -> ActiveWindow {
    let mut window = ActiveWindow {
        index: None,
        from: 0,
        until: Millis::MAX,
    };
    for (i, p) in policies.iter().enumerate().rev() {
        let (matched, from, until) = p.match_window(now);
        window.from = window.from.max(from);
        window.until = window.until.min(until);
        if matched {
            window.index = Some(i);
            break;
        }
    }
    window
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;

    fn at(tz: Tz, y: i32, m: u32, d: u32, h: u32, min: u32) -> Millis {
        let naive = NaiveDate::from_ymd_opt(y, m, d).and_then(|d| d.and_hms_opt(h, min, 30));
        let t = naive.and_then(|n| tz.from_local_datetime(&n).earliest());
        t.map(|t| t.timestamp_millis() as u64).unwrap_or_default()
    }

    fn policy(periods: &[&str], tz: &str, idle: u32) -> Policy {
        Policy::new(
            periods.iter().map(|s| s.to_string()).collect(),
            tz,
            idle,
            0,
            0.0,
            0,
            false,
        )
        .unwrap_or_else(|e| panic!("{e:?}"))
    }

    #[test]
    fn a_bad_cron_field_is_named_in_our_words() {
        for (cron, want) in [
            ("* * * 99 *", "month 99 is out of range (1-12 or JAN-DEC)"),
            ("61 * * * *", "minute 61 is out of range (0-59)"),
            ("* 8-25 * * *", "hour 25 is out of range (0-23)"),
            (
                "* * * * FUN",
                "weekday \"FUN\" is not a value (0-7 or SUN-SAT)",
            ),
            (
                "*/0 * * * *",
                "minute step \"0\" must be a whole number of at least 1",
            ),
            ("* * 0 * *", "day of month 0 is out of range (1-31)"),
        ] {
            let e = parse_cron(cron).err().unwrap_or_default();
            assert!(e.contains(want), "{cron}: {e}");
            assert!(!e.contains("Component"), "{cron}: {e}");
        }
        for good in [
            "* 8-18 * * MON-FRI",
            "*/15 * * * *",
            "0 0 1,15 jan-jun 0",
            "0 0 L * *",
        ] {
            assert!(parse_cron(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn last_matching_policy_wins() {
        let all = policy(&["* * * * *"], "UTC", 1);
        let work = policy(&["* 8-17 * * mon-fri"], "Europe/Berlin", 10);
        let policies = [all, work];
        let tz: Tz = chrono_tz::Europe::Berlin;
        assert_eq!(
            active(&policies, at(tz, 2026, 12, 1, 9, 0)).map(|p| p.idle_count),
            Some(10)
        );
        assert_eq!(
            active(&policies, at(tz, 2026, 12, 1, 18, 0)).map(|p| p.idle_count),
            Some(1)
        );
        assert_eq!(
            active(&policies, at(tz, 2026, 12, 5, 9, 0)).map(|p| p.idle_count),
            Some(1),
            "saturday"
        );
    }

    #[test]
    fn periods_follow_the_zone_across_dst() {
        // 08:00-08:59 Berlin local time, before and after the 2026-03-29 spring-forward.
        let p = policy(&["* 8 * * *"], "Europe/Berlin", 1);
        let tz: Tz = chrono_tz::Europe::Berlin;
        for day in [28, 29, 30] {
            assert!(
                p.matches(at(tz, 2026, 3, day, 8, 15)),
                "08:15 local on March {day}"
            );
            assert!(
                !p.matches(at(tz, 2026, 3, day, 9, 15)),
                "09:15 local on March {day}"
            );
        }
        // In UTC the window moved from 07:xx to 06:xx.
        assert!(p.matches(at(Tz::UTC, 2026, 3, 28, 7, 15)));
        assert!(p.matches(at(Tz::UTC, 2026, 3, 30, 6, 15)));
        assert!(!p.matches(at(Tz::UTC, 2026, 3, 30, 7, 15)));
    }

    #[test]
    fn the_cached_window_agrees_with_evaluating_every_second() {
        // Berlin across the 2026 spring-forward, and Amsterdam in 1937, when its offset was
        // +00:19:32 and local minutes did not start on UTC minutes.
        let cases = [
            (
                policy(&["* 2-3 * * *", "30-45 * * * *"], "Europe/Berlin", 1),
                1_774_742_400_000,
            ),
            (policy(&["0-10 * * * *"], "Europe/Amsterdam", 1), 0),
        ];
        for (p, start) in cases {
            let policies = [policy(&["* * * * *"], "UTC", 0), p];
            let mut now = start;
            while now < start + 6 * 3_600_000 {
                let w = active_window(&policies, now);
                let index = |t| active(&policies, t).map(|p| p.idle_count);
                let found = w.index.and_then(|i| policies.get(i)).map(|p| p.idle_count);
                assert!(w.covers(now), "{now} in {w:?}");
                assert_eq!(found, index(now), "at {now}");
                assert_eq!(index(w.from), found, "window start of {w:?}");
                assert_eq!(index(w.until - 1), found, "window end of {w:?}");
                now += 7_001;
            }
        }
    }

    #[test]
    fn bad_input_names_the_key() {
        let e = Policy::new(
            vec!["* * *".into(), "61 * * * *".into()],
            "Mars/Olympus",
            0,
            0,
            -1.0,
            0,
            false,
        )
        .err()
        .unwrap_or_default();
        let keys: Vec<&str> = e.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["periods[0]", "periods[1]", "timezone", "scale_factor"]
        );
    }

    #[test]
    fn idle_target_uses_scale_factor_and_limit() {
        let p = Policy::new(vec!["* * * * *".into()], "UTC", 2, 0, 0.5, 3, false)
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(p.idle_target(0), 2);
        assert_eq!(p.idle_target(5), 3);
        assert_eq!(p.idle_target(100), 3);
    }
}
