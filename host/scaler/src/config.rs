//! The scaler's part of a pool's configuration: `[[pool.policy]]`, `scale_throttle`, and the
//! numeric knobs (GitLab Runner's `[runners.autoscaler]` names), validated into
//! [`ScalerConfig`] and [`Policy`]. The binary places these in the document; this module
//! knows nothing of files or lines.

use std::time::Duration;

use serde::Deserialize;

use flotilla_validate::{Context, KeyPath, Problems, Validate};

use crate::{Millis, Policy, ScalerConfig};

fn millis(d: Duration) -> Millis {
    Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX)
}

/// `[[pool.policy]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// 5-field cron expressions.
    #[serde(default = "default_periods")]
    pub periods: Vec<String>,
    /// IANA zone for the periods.
    #[serde(default = "default_timezone")]
    pub timezone: String,
    /// Idle job slots to keep.
    #[serde(default)]
    pub idle_count: u32,
    /// How long an unused instance may stay.
    #[serde(default = "default_idle_time", with = "humantime_serde")]
    pub idle_time: Duration,
    /// Extra idle slots per slot in use.
    #[serde(default)]
    pub scale_factor: f64,
    /// Cap on the extra idle slots (0 = none).
    #[serde(default)]
    pub scale_factor_limit: u32,
    /// Reserve only when an idle slot exists.
    #[serde(default)]
    pub preemptive_mode: bool,
}

fn default_periods() -> Vec<String> {
    vec!["* * * * *".to_string()]
}
fn default_timezone() -> String {
    "UTC".to_string()
}
fn default_idle_time() -> Duration {
    Duration::from_secs(300)
}

/// `scale_throttle = { limit, burst }`: a token bucket on instance creation.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThrottleConfig {
    /// Instances per second.
    pub limit: f64,
    /// Bucket size.
    pub burst: u32,
}

/// Declares a config table that holds the pool knobs (GitLab Runner's `[runners.autoscaler]`
/// names), which sit directly in `[[pool]]`: the table's own fields, then every knob with its
/// serde default, and `fn knobs(&self) -> KnobsConfig` for [`KnobsConfig`]'s validation.
///
/// The knobs are listed only here. serde's `flatten` would let the binary's `PoolConfig` hold a
/// `KnobsConfig` field instead, but it cannot be combined with `deny_unknown_fields`, and the
/// config's located errors rely on that (an unknown key is an error naming its file and line).
/// [`KnobsConfig`] is declared with this macro too, so the file's keys, their defaults and the
/// scaler's copy cannot drift.
///
/// The defaults are paths into [`knob_default`], which takes them from
/// [`ScalerConfig::default`]: the one place they are written. serde takes those paths as
/// text, so the declaring crate must know this crate as `flotilla_scaler` (the scaler itself
/// does, by `extern crate self`), and needs `serde` and `humantime-serde`. `KnobsConfig`'s own
/// `knobs()` is a clone, unused.
#[macro_export]
macro_rules! with_pool_knobs {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident { $($fields:tt)* }
    ) => {
        $crate::with_pool_knobs! {
            @declare [$(#[$meta])* $vis struct $name { $($fields)* }]
            /// Job slots per instance.
            #[serde(default = "flotilla_scaler::config::knob_default::capacity_per_instance")]
            capacity_per_instance: u32,
            /// Jobs per instance before it is replaced (0 = unlimited).
            #[serde(default = "flotilla_scaler::config::knob_default::max_use_count")]
            max_use_count: u32,
            /// Upper bound on instances (no default: a pool must say it).
            max_instances: u32,
            /// How long acquire waits for a ready instance.
            #[serde(
                default = "flotilla_scaler::config::knob_default::instance_acquire_timeout",
                with = "humantime_serde"
            )]
            instance_acquire_timeout: ::std::time::Duration,
            /// Safety-net polling of `update()`.
            #[serde(
                default = "flotilla_scaler::config::knob_default::update_interval",
                with = "humantime_serde"
            )]
            update_interval: ::std::time::Duration,
            /// Polling of `update()` while instances are expected (requested, not yet running).
            #[serde(
                default = "flotilla_scaler::config::knob_default::update_interval_when_expecting",
                with = "humantime_serde"
            )]
            update_interval_when_expecting: ::std::time::Duration,
            /// Wait before retrying a deletion.
            #[serde(
                default = "flotilla_scaler::config::knob_default::deletion_retry_interval",
                with = "humantime_serde"
            )]
            deletion_retry_interval: ::std::time::Duration,
            /// Consecutive readiness failures before replacement.
            #[serde(default = "flotilla_scaler::config::knob_default::failure_threshold")]
            failure_threshold: u32,
            /// Boot time during which failed readiness checks are retried but not counted.
            #[serde(
                default = "flotilla_scaler::config::knob_default::instance_ready_grace",
                with = "humantime_serde"
            )]
            instance_ready_grace: ::std::time::Duration,
            /// Leases must be renewed within this (`POST .../renew`); absent: no TTL.
            #[serde(
                default = "flotilla_scaler::config::knob_default::lease_ttl",
                with = "humantime_serde"
            )]
            lease_ttl: ::std::option::Option<::std::time::Duration>,
            /// An acquired lease older than this is failed and reported; absent: no limit.
            #[serde(
                default = "flotilla_scaler::config::knob_default::max_job_duration",
                with = "humantime_serde"
            )]
            max_job_duration: ::std::option::Option<::std::time::Duration>,
            /// How often a call refused as unauthorized or misconfigured is tried again.
            #[serde(
                default = "flotilla_scaler::config::knob_default::paused_retry_interval",
                with = "humantime_serde"
            )]
            paused_retry_interval: ::std::time::Duration,
            /// Token bucket on instance creation; absent: unthrottled.
            #[serde(default)]
            scale_throttle: ::std::option::Option<$crate::config::ThrottleConfig>,
            /// How long the pool counts as unable to grow after it last could not.
            #[serde(
                default = "flotilla_scaler::config::knob_default::fallback_hold",
                with = "humantime_serde"
            )]
            fallback_hold: ::std::time::Duration,
            /// An instance the cloud fails or takes back within this long of coming means the
            /// pool cannot grow.
            #[serde(
                default = "flotilla_scaler::config::knob_default::fallback_failing_within",
                with = "humantime_serde"
            )]
            fallback_failing_within: ::std::time::Duration,
        }
    };
    (
        @declare [$(#[$meta:meta])* $vis:vis struct $name:ident { $($fields:tt)* }]
        $($(#[$knob_meta:meta])* $knob:ident: $ty:ty,)*
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $($fields)*
            $($(#[$knob_meta])* pub $knob: $ty,)*
        }

        impl $name {
            /// The table's knobs, for the scaler to validate.
            pub fn knobs(&self) -> $crate::config::KnobsConfig {
                $crate::config::KnobsConfig {
                    $($knob: ::std::clone::Clone::clone(&self.$knob),)*
                }
            }
        }
    };
}

with_pool_knobs! {
    /// The numeric knobs of a pool as written (they sit directly in `[[pool]]`; the binary's
    /// table declares them with [`with_pool_knobs!`]).
    #[derive(Debug, Clone, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct KnobsConfig {}
}

/// The serde defaults of the knobs a table leaves out, which [`with_pool_knobs!`] names:
/// [`ScalerConfig::default`]'s values, so the defaults are written once.
pub mod knob_default {
    use std::time::Duration;

    use crate::{Millis, ScalerConfig};

    fn d() -> ScalerConfig {
        ScalerConfig::default()
    }
    fn ms(m: Millis) -> Duration {
        Duration::from_millis(m)
    }
    /// `capacity_per_instance`.
    pub fn capacity_per_instance() -> u32 {
        d().capacity_per_instance
    }
    /// `max_use_count`.
    pub fn max_use_count() -> u32 {
        d().max_use_count
    }
    /// `instance_acquire_timeout`.
    pub fn instance_acquire_timeout() -> Duration {
        ms(d().instance_acquire_timeout_ms)
    }
    /// `update_interval`.
    pub fn update_interval() -> Duration {
        ms(d().update_interval_ms)
    }
    /// `update_interval_when_expecting`.
    pub fn update_interval_when_expecting() -> Duration {
        ms(d().update_interval_when_expecting_ms)
    }
    /// `deletion_retry_interval`.
    pub fn deletion_retry_interval() -> Duration {
        ms(d().deletion_retry_interval_ms)
    }
    /// `failure_threshold`.
    pub fn failure_threshold() -> u32 {
        d().failure_threshold
    }
    /// `instance_ready_grace`.
    pub fn instance_ready_grace() -> Duration {
        ms(d().instance_ready_grace_ms)
    }
    /// `lease_ttl`.
    pub fn lease_ttl() -> Option<Duration> {
        d().lease_ttl_ms.map(ms)
    }
    /// `max_job_duration`.
    pub fn max_job_duration() -> Option<Duration> {
        d().max_job_duration_ms.map(ms)
    }
    /// `paused_retry_interval`.
    pub fn paused_retry_interval() -> Duration {
        ms(d().paused_retry_interval_ms)
    }
    /// `fallback_hold`.
    pub fn fallback_hold() -> Duration {
        ms(d().fallback_hold_ms)
    }
    /// `fallback_failing_within`.
    pub fn fallback_failing_within() -> Duration {
        ms(d().fallback_failing_within_ms)
    }
}

impl Validate for KnobsConfig {
    type Output = ScalerConfig;

    fn validate(&self, _: &Context, at: &KeyPath, problems: &mut Problems) -> Option<ScalerConfig> {
        let capacity = problems.at_least(
            &at.key("capacity_per_instance"),
            self.capacity_per_instance,
            1,
        );
        let max_instances = problems.at_least(&at.key("max_instances"), self.max_instances, 1);
        let failure_threshold =
            problems.at_least(&at.key("failure_threshold"), self.failure_threshold, 1);
        let mut ok = problems.nonzero_durations(
            at,
            &[
                ("update_interval", self.update_interval),
                (
                    "update_interval_when_expecting",
                    self.update_interval_when_expecting,
                ),
                ("instance_acquire_timeout", self.instance_acquire_timeout),
                ("deletion_retry_interval", self.deletion_retry_interval),
                ("paused_retry_interval", self.paused_retry_interval),
                ("fallback_hold", self.fallback_hold),
                ("fallback_failing_within", self.fallback_failing_within),
            ],
        );
        for (key, value) in [
            ("lease_ttl", self.lease_ttl),
            ("max_job_duration", self.max_job_duration),
        ] {
            if value.is_some_and(|d| d.is_zero()) {
                problems.add(
                    &at.key(key),
                    "must be greater than zero; leave it out for no limit",
                );
                ok = false;
            }
        }
        let (throttle_limit, throttle_burst) = match self.scale_throttle {
            None => (0.0, 1),
            Some(t) => {
                let at = at.key("scale_throttle");
                if !t.limit.is_finite() || t.limit <= 0.0 {
                    problems.add(
                        &at.key("limit"),
                        "must be a positive number of instances per second",
                    );
                    ok = false;
                }
                (t.limit, problems.at_least(&at.key("burst"), t.burst, 1)?)
            }
        };
        if !ok {
            return None;
        }
        Some(ScalerConfig {
            capacity_per_instance: capacity?,
            max_use_count: self.max_use_count,
            max_instances: max_instances?,
            throttle_limit,
            throttle_burst,
            failure_threshold: failure_threshold?,
            deletion_retry_interval_ms: millis(self.deletion_retry_interval),
            instance_acquire_timeout_ms: millis(self.instance_acquire_timeout),
            update_interval_ms: millis(self.update_interval),
            update_interval_when_expecting_ms: millis(self.update_interval_when_expecting),
            instance_ready_grace_ms: millis(self.instance_ready_grace),
            lease_ttl_ms: self.lease_ttl.map(millis),
            max_job_duration_ms: self.max_job_duration.map(millis),
            paused_retry_interval_ms: millis(self.paused_retry_interval),
            fallback_hold_ms: millis(self.fallback_hold),
            fallback_failing_within_ms: millis(self.fallback_failing_within),
        })
    }
}

/// A policy checked against the pool it belongs to: `idle_count` must be reachable with
/// `max_slots` (max_instances x capacity_per_instance), when those are known.
#[derive(Debug, Clone, Copy)]
pub struct InPool<'a> {
    /// The policy as written.
    pub policy: &'a PolicyConfig,
    /// The pool's slot ceiling, when its knobs were valid.
    pub max_slots: Option<u64>,
}

impl Validate for InPool<'_> {
    type Output = Policy;

    fn validate(&self, _: &Context, at: &KeyPath, problems: &mut Problems) -> Option<Policy> {
        let p = self.policy;
        let mut ok = true;
        if let Some(max_slots) = self.max_slots
            && u64::from(p.idle_count) > max_slots
        {
            problems.add(
                &at.key("idle_count"),
                format!(
                    "{} idle slots can never be met: max_instances x capacity_per_instance = {max_slots}",
                    p.idle_count
                ),
            );
            ok = false;
        }
        let policy = Policy::new(
            p.periods.clone(),
            &p.timezone,
            p.idle_count,
            millis(p.idle_time),
            p.scale_factor,
            p.scale_factor_limit,
            p.preemptive_mode,
        );
        match policy {
            Ok(policy) if ok => Some(policy),
            Ok(_) => None,
            Err(errors) => {
                for (key, message) in errors {
                    problems.add(&policy_key(at, &key), message);
                }
                None
            }
        }
    }
}

/// `Policy::new` names keys as `periods[2]` or `timezone`; this places them under `at`.
fn policy_key(at: &KeyPath, key: &str) -> KeyPath {
    match key.split_once('[') {
        Some((name, rest)) => match rest.trim_end_matches(']').parse() {
            Ok(n) => at.key(name).index(n),
            Err(_) => at.key(name),
        },
        None => at.key(key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx() -> Context {
        Context {
            base_dir: ".".into(),
            check_files: false,
        }
    }

    /// The knobs of a table that says only `max_instances`: what serde fills in.
    fn defaults(max_instances: u32) -> KnobsConfig {
        use serde::de::value::{Error, MapDeserializer};
        let written =
            MapDeserializer::<_, Error>::new([("max_instances", max_instances)].into_iter());
        KnobsConfig::deserialize(written).expect("a table with only max_instances is valid")
    }

    fn knobs() -> KnobsConfig {
        KnobsConfig {
            capacity_per_instance: 2,
            ..defaults(4)
        }
    }

    #[test]
    fn valid_knobs_become_a_scaler_config() {
        let mut problems = Problems::default();
        let cfg = knobs().validate(&cx(), &KeyPath::root(), &mut problems);
        assert!(problems.is_empty());
        assert_eq!(cfg.map(|c| c.max_instances), Some(4));
    }

    /// A pool that leaves every knob out runs with the scaler's defaults, unchanged by the
    /// trip through durations.
    #[test]
    fn the_default_knobs_are_the_scalers_defaults() {
        let mut problems = Problems::default();
        let cfg = defaults(7).validate(&cx(), &KeyPath::root(), &mut problems);
        let want = ScalerConfig {
            max_instances: 7,
            ..ScalerConfig::default()
        };
        assert_eq!(cfg, Some(want));
    }

    #[test]
    fn every_bad_knob_is_reported_and_nothing_is_built() {
        let mut k = knobs();
        k.capacity_per_instance = 0;
        k.update_interval = Duration::ZERO;
        k.scale_throttle = Some(ThrottleConfig {
            limit: -1.0,
            burst: 0,
        });
        let mut problems = Problems::default();
        let at = KeyPath::root().key("pool").index(0);
        assert!(k.validate(&cx(), &at, &mut problems).is_none());
        let keys: Vec<String> = problems
            .into_vec()
            .iter()
            .map(|p| p.path.to_string())
            .collect();
        assert_eq!(
            keys,
            [
                "pool[0].capacity_per_instance",
                "pool[0].update_interval",
                "pool[0].scale_throttle.limit",
                "pool[0].scale_throttle.burst"
            ]
        );
    }

    #[test]
    fn an_idle_count_above_the_pool_ceiling_is_refused() {
        let policy: PolicyConfig = PolicyConfig {
            periods: default_periods(),
            timezone: default_timezone(),
            idle_count: 9,
            idle_time: default_idle_time(),
            scale_factor: 0.0,
            scale_factor_limit: 0,
            preemptive_mode: false,
        };
        let mut problems = Problems::default();
        let at = KeyPath::root().key("policy").index(0);
        let checked = InPool {
            policy: &policy,
            max_slots: Some(8),
        }
        .validate(&cx(), &at, &mut problems);
        assert!(checked.is_none());
        assert_eq!(problems.len(), 1);
    }
}
