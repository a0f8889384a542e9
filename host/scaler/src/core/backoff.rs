//! Backing off one kind of provider call: exponential with full jitter after failures and
//! after calls that made no progress, honouring the cloud's retry-after, and a slow retry
//! schedule for refusals an operator must fix (credentials, permissions, settings), so a fix
//! heals the pool without a restart.

use serde::Serialize;

use crate::Millis;

/// Ceiling of the exponential backoff.
pub(super) const MAX_BACKOFF_MS: Millis = 5 * 60 * 1000;

/// One call kind's backoff.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Backoff {
    attempt: u32,
    /// No call of this kind before this time.
    pub(super) until: Millis,
    /// Set while an operator must fix something; cleared by the next success.
    pub(super) paused: Option<Pause>,
}

/// A call kind waiting for an operator's fix, as `/v1/pools` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pause {
    /// What the cloud or plugin said.
    pub reason: String,
    /// When the call is tried again (ms since the Unix epoch).
    pub retry_at: Millis,
}

impl Backoff {
    /// Whether a call may be made at `now`.
    pub(super) fn ready(&self, now: Millis) -> bool {
        now >= self.until
    }

    /// A failure or a call without progress: the next wait, doubled up to the ceiling, with
    /// full jitter derived from the clock (so virtual-time runs stay deterministic), and at
    /// least `retry_after`.
    pub(super) fn fail(&mut self, now: Millis, retry_after: Millis) {
        self.attempt = (self.attempt + 1).min(20);
        let base = 1000u64
            .saturating_mul(1 << self.attempt.min(9))
            .min(MAX_BACKOFF_MS);
        let jitter = (now
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
            >> 33)
            % (base / 2 + 1);
        self.until = now + (base / 2 + jitter).max(retry_after);
    }

    /// The cloud asked this pool to wait (a throttle on another call kind): no call of this
    /// kind before `until`, without counting a failure of its own.
    pub(super) fn hold(&mut self, until: Millis) {
        self.until = self.until.max(until);
    }

    /// A refusal only an operator can fix: try again after `every`.
    pub(super) fn pause(&mut self, now: Millis, every: Millis, reason: String) {
        self.until = now.saturating_add(every);
        self.paused = Some(Pause {
            reason,
            retry_at: self.until,
        });
    }

    /// A call that made progress.
    pub(super) fn ok(&mut self) {
        self.attempt = 0;
        self.paused = None;
    }
}
