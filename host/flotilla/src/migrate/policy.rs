//! Docker Machine's idle settings and autoscaling periods as `[[pool.policy]]` tables.

use super::*;

impl Runner<'_> {
    /// One `[[pool.policy]]`: the machine section's own keys (`section = false`, every
    /// minute), or an autoscaling section with its periods.
    pub(super) fn policy(
        &mut self,
        table: &toml::Table,
        at: &KeyPath,
        section: bool,
        options: &Options,
    ) -> Option<String> {
        let (periods, timezone) = if section {
            let (periods, timezone) = self.section_when(table, at, options);
            (periods, Some(timezone))
        } else {
            (vec!["* * * * *".to_string()], None)
        };
        // An active autoscaling section's keys replace the machine section's whole, unset ones
        // as 0 (GitLab Runner's getters return the section's value when one matches).
        let idle_count = self.uint(table, at, "IdleCount").unwrap_or(0);
        let idle_time = self.uint(table, at, "IdleTime").unwrap_or(0);
        let factor = self.float(table, at, "IdleScaleFactor").unwrap_or(0.0);
        let count_min = self.uint(table, at, "IdleCountMin").unwrap_or(0);
        let mut s = String::from("\n[[pool.policy]]\n");
        if let Some(tz) = timezone {
            let list: Vec<String> = periods.iter().map(|p| quote(p)).collect();
            let _ = writeln!(s, "periods = [{}]", list.join(", "));
            let _ = writeln!(s, "timezone = {}", quote(&tz));
        }
        self.idle_lines(&mut s, at, (idle_count, factor, count_min));
        let _ = writeln!(s, "idle_time = \"{idle_time}s\"");
        Some(s)
    }

    /// An autoscaling section's periods as cron expressions and its time zone (the runner
    /// host's, `--timezone`, when empty); its unknown keys are reported.
    fn section_when(
        &mut self,
        table: &toml::Table,
        at: &KeyPath,
        options: &Options,
    ) -> (Vec<String>, String) {
        let mut periods = Vec::new();
        match table.get("Periods").and_then(toml::Value::as_array) {
            Some(list) if !list.is_empty() => {
                for (i, p) in list.iter().enumerate() {
                    let p_at = at.key("Periods").index(i);
                    match p.as_str().map(convert_period) {
                        Some(Ok(cron)) => periods.push(cron),
                        Some(Err(why)) => self.refuse(&p_at, why),
                        None => self.refuse(&p_at, "must be a string"),
                    }
                }
            }
            _ => self.refuse(
                &at.key("Periods"),
                "an autoscaling section needs at least one period",
            ),
        }
        let zone = table
            .get("Timezone")
            .and_then(toml::Value::as_str)
            .unwrap_or("");
        let timezone = if zone.is_empty() {
            self.changed(
                &at.key("Timezone"),
                format!(
                    "empty means the runner host's local zone; written as {:?} (--timezone)",
                    options.timezone
                ),
            );
            options.timezone.clone()
        } else {
            zone.to_string()
        };
        let known = [
            "IdleCount",
            "IdleCountMin",
            "IdleScaleFactor",
            "IdleTime",
            "Periods",
            "Timezone",
        ];
        for key in table.keys() {
            if !known.contains(&key.as_str()) {
                self.unmapped(&at.key(key), "not a key of an autoscaling section");
            }
        }
        (periods, timezone)
    }

    /// The idle lines of a policy: Docker Machine's idle count, or its scale factor between
    /// IdleCountMin and IdleCount.
    fn idle_lines(
        &mut self,
        s: &mut String,
        at: &KeyPath,
        (idle_count, factor, count_min): (u32, f64, u32),
    ) {
        if factor > 0.0 && idle_count > 0 {
            // Docker Machine keeps in_use × factor idle machines, at least IdleCountMin (which
            // it raises to 1) and at most IdleCount; Flotilla keeps max(idle_count,
            // min(⌈in_use × scale_factor⌉, scale_factor_limit)).
            let floor = count_min.max(1);
            if count_min == 0 {
                self.changed(
                    &at.key("IdleCountMin"),
                    "0 with IdleScaleFactor set means 1 in Docker Machine: idle_count = 1",
                );
            }
            self.changed(
                &at.key("IdleScaleFactor"),
                format!(
                    "scale_factor = {factor} with idle_count = {floor} and scale_factor_limit = {idle_count}; Flotilla rounds in_use × factor up"
                ),
            );
            let _ = writeln!(s, "idle_count = {floor}");
            let _ = writeln!(s, "scale_factor = {factor:?}");
            let _ = writeln!(s, "scale_factor_limit = {idle_count}");
        } else {
            if factor > 0.0 {
                self.changed(
                    &at.key("IdleScaleFactor"),
                    "IdleCount 0 caps the factor's idle machines at 0 in Docker Machine: no scale_factor written",
                );
            }
            let _ = writeln!(s, "idle_count = {idle_count}");
        }
    }
}

/// A Docker Machine period (gorhill/cronexpr, 7 fields: second minute hour day month weekday
/// year) as the 5-field cron expression matching the same whole minutes.
pub fn convert_period(period: &str) -> Result<String, String> {
    let fields: Vec<&str> = period.split_whitespace().collect();
    let every_second = ["*", "0-59", "*/1"];
    match fields.as_slice() {
        [second, rest @ .., year] if fields.len() == 7 => {
            if !every_second.contains(second) {
                return Err(format!(
                    "{period:?}: its seconds field {second:?} makes it active only during those seconds of a minute (GitLab Runner checks the period every second), which 5-field cron cannot express; use \"*\" for whole minutes"
                ));
            }
            if !["*", "?"].contains(year) {
                return Err(format!(
                    "{period:?}: its year field {year:?} cannot be expressed in 5-field cron"
                ));
            }
            let cron = rest.join(" ");
            flotilla_scaler::Policy::new(vec![cron.clone()], "UTC", 0, 0, 0.0, 0, false).map_err(
                |_| format!("{period:?}: {cron:?} is not a cron expression Flotilla accepts"),
            )?;
            Ok(cron)
        }
        _ => Err(format!(
            "{period:?} has {} fields: cronexpr then prepends a seconds field of 0, so Docker Machine applied it for about two seconds a minute, which cron cannot express; write it with 7 fields (\"* MIN HOUR DAY MONTH WEEKDAY *\")",
            fields.len()
        )),
    }
}
