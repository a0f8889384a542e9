//! The screening model: a slot-level queue that ranks hundreds of candidate policies on
//! millions of jobs in seconds. It is not the scaler; it only decides which candidates the real
//! scaler (the simulator) is asked about, and every figure `tune` prints comes from the real
//! one. It owns its approximations, which are:
//!
//! - slots, not instances: an instance is `capacity` slots that boot together and are removed
//!   together once `capacity` slots have been idle past `idle_time`;
//! - a job takes the most recently freed slot (the scaler packs jobs onto busy instances, so
//!   the slots idle longest are the ones that expire);
//! - an instance is seen ready at the first `update` after it boots (the scaler learns of a
//!   running instance from `update`, every `update_interval`);
//! - no provider failures, throttling or `max_use_count` re-provisioning.
//!
//! It must not know about config files or output.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use flotilla_scaler::sim::Rng;

/// The pool's fixed parameters.
#[derive(Debug, Clone, Copy)]
pub struct Pool {
    /// Slots per instance.
    pub capacity: u32,
    /// Most instances.
    pub max_instances: u32,
    /// A job gives up after waiting this long (ms).
    pub acquire_timeout_ms: u64,
    /// How often the scaler asks the cloud what exists (ms).
    pub update_interval_ms: u64,
    /// Provisioning delay range (ms).
    pub delay_ms: (u64, u64),
}

/// One period's knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Knobs {
    /// Idle slots to keep.
    pub idle_count: u32,
    /// How long an idle instance is kept beyond the target (ms).
    pub idle_time_ms: u64,
    /// Extra idle slots as a share of slots in use.
    pub scale_factor: f64,
}

impl Knobs {
    fn idle_target(&self, in_use: u32) -> u32 {
        let extra = (f64::from(in_use) * self.scale_factor).ceil() as u32;
        self.idle_count.max(extra)
    }
}

/// Which period is active, minute by minute.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// The first minute's start (ms).
    pub start_ms: i64,
    /// The period of each minute (an index into a candidate's knobs).
    pub minutes: Vec<u8>,
}

impl Schedule {
    fn period(&self, t: i64) -> usize {
        let m = (t - self.start_ms).div_euclid(60_000);
        usize::try_from(m)
            .ok()
            .and_then(|m| self.minutes.get(m))
            .map_or(0, |&p| usize::from(p))
    }

    /// The next time after `t` the period changes.
    fn next_change(&self, t: i64) -> i64 {
        let m = (t - self.start_ms).div_euclid(60_000).max(0) as usize;
        let now = self.minutes.get(m).copied();
        let rest = self.minutes.get(m + 1..).unwrap_or_default();
        match rest.iter().position(|&p| Some(p) != now) {
            Some(k) => self.start_ms + ((m + 1 + k) as i64) * 60_000,
            None => i64::MAX,
        }
    }
}

/// What the screening found for one candidate.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Figures {
    /// Instance-hours.
    pub instance_hours: f64,
    /// Wait p50, p95, max over the jobs that started (s).
    pub wait_p50_s: f64,
    /// 95th percentile.
    pub wait_p95_s: f64,
    /// Maximum.
    pub wait_max_s: f64,
    /// Jobs that gave up.
    pub timed_out: u64,
}

/// Runs the jobs (`(submit_ms, duration_ms)`, ordered) under `knobs` per period.
pub fn run(pool: &Pool, schedule: &Schedule, knobs: &[Knobs], jobs: &[(i64, u64)]) -> Figures {
    let Some(&(first, _)) = jobs.first() else {
        return Figures::default();
    };
    let knobs_at = |t: i64| {
        knobs
            .get(schedule.period(t))
            .or(knobs.first())
            .copied()
            .unwrap_or(Knobs {
                idle_count: 0,
                idle_time_ms: 0,
                scale_factor: 0.0,
            })
    };
    let mut queue = Queue::new(pool, first);
    let mut change = schedule.next_change(first);
    let mut k = knobs_at(first);
    while let Some(mut next) = queue.next_event(jobs, &k) {
        if change <= next && change < i64::MAX {
            next = change;
        }
        queue.advance_to(next);
        if next >= change {
            k = knobs_at(next);
            change = schedule.next_change(next);
        }
        queue.arrive(jobs);
        queue.serve();
        queue.scale(&k);
        let done =
            queue.next_job >= jobs.len() && queue.finishes.is_empty() && queue.waiting.is_empty();
        if done {
            break;
        }
    }
    figures(
        queue.waits,
        queue.zero_waits,
        queue.timed_out,
        queue.instance_ms,
    )
}

/// The screening model's state between events: the slots, the instances and the jobs.
struct Queue<'p> {
    pool: &'p Pool,
    /// Slots per instance (at least 1).
    c: u32,
    rng: Rng,
    now: i64,
    next_job: usize,
    finishes: BinaryHeap<Reverse<i64>>,
    booting: BinaryHeap<Reverse<i64>>,
    /// Idle slots by when they became idle: oldest at the front.
    idle: VecDeque<i64>,
    waiting: VecDeque<(i64, u64)>,
    ready_instances: u32,
    busy: u32,
    waits: Vec<u32>,
    zero_waits: u64,
    timed_out: u64,
    instance_ms: f64,
}

impl<'p> Queue<'p> {
    fn new(pool: &'p Pool, now: i64) -> Self {
        Queue {
            pool,
            c: pool.capacity.max(1),
            rng: Rng(0x5eed),
            now,
            next_job: 0,
            finishes: BinaryHeap::new(),
            booting: BinaryHeap::new(),
            idle: VecDeque::new(),
            waiting: VecDeque::new(),
            ready_instances: 0,
            busy: 0,
            waits: Vec::new(),
            zero_waits: 0,
            timed_out: 0,
            instance_ms: 0.0,
        }
    }

    /// The next event: an arrival, a finish, an instance ready, the oldest idle slot's expiry,
    /// or the oldest waiter's timeout; `None` when nothing is left to happen.
    fn next_event(&self, jobs: &[(i64, u64)], k: &Knobs) -> Option<i64> {
        let mut next = i64::MAX;
        if let Some(&(t, _)) = jobs.get(self.next_job) {
            next = next.min(t);
        }
        if let Some(&Reverse(t)) = self.finishes.peek() {
            next = next.min(t);
        }
        if let Some(&Reverse(t)) = self.booting.peek() {
            next = next.min(t);
        }
        // The oldest idle slot's expiry, if still ahead: one already past it is kept for the
        // idle target, and only another event can change that.
        if let Some(&t) = self.idle.front()
            && t + k.idle_time_ms as i64 > self.now
        {
            next = next.min(t + k.idle_time_ms as i64);
        }
        if let Some(&(t, _)) = self.waiting.front() {
            next = next.min(t + self.pool.acquire_timeout_ms as i64);
        }
        (next != i64::MAX).then_some(next)
    }

    /// Time passes to `next`: instance time is counted, finished jobs free their slots and
    /// booted instances bring theirs.
    fn advance_to(&mut self, next: i64) {
        let live = self.ready_instances + self.booting.len() as u32;
        self.instance_ms += (next.saturating_sub(self.now)) as f64 * f64::from(live);
        self.now = next;
        while let Some(&Reverse(t)) = self.finishes.peek() {
            if t > self.now {
                break;
            }
            self.finishes.pop();
            self.busy -= 1;
            self.idle.push_back(t);
        }
        while let Some(&Reverse(t)) = self.booting.peek() {
            if t > self.now {
                break;
            }
            self.booting.pop();
            self.ready_instances += 1;
            for _ in 0..self.c {
                self.idle.push_back(t);
            }
        }
    }

    /// The jobs submitted by now join the queue.
    fn arrive(&mut self, jobs: &[(i64, u64)]) {
        while let Some(&(t, d)) = jobs.get(self.next_job) {
            if t > self.now {
                break;
            }
            self.next_job += 1;
            self.waiting.push_back((t, d));
        }
    }

    /// Timeouts, then the waiting jobs in order on the most recently freed slots.
    fn serve(&mut self) {
        while let Some(&(t, _)) = self.waiting.front() {
            if self.now - t < self.pool.acquire_timeout_ms as i64 {
                break;
            }
            self.waiting.pop_front();
            self.timed_out += 1;
        }
        while !self.waiting.is_empty() && !self.idle.is_empty() {
            let Some((submitted, duration)) = self.waiting.pop_front() else {
                break;
            };
            self.idle.pop_back();
            self.busy += 1;
            let wait = (self.now - submitted).max(0) as u64;
            if wait == 0 {
                self.zero_waits += 1;
            } else {
                self.waits.push(u32::try_from(wait).unwrap_or(u32::MAX));
            }
            self.finishes.push(Reverse(self.now + duration as i64));
        }
    }

    /// Scale: up to the target, or down past idle_time.
    fn scale(&mut self, k: &Knobs) {
        let pool = self.pool;
        let c = self.c;
        let in_use =
            (self.busy + self.waiting.len() as u32).min(pool.max_instances.saturating_mul(c));
        let want = in_use
            .saturating_add(k.idle_target(in_use))
            .div_ceil(c)
            .min(pool.max_instances);
        let live = self.ready_instances + self.booting.len() as u32;
        if want > live {
            let update = pool.update_interval_ms.max(1) as i64;
            let (lo, hi) = pool.delay_ms;
            for _ in live..want {
                let delay = self.rng.range(lo, hi);
                let up = self.now + delay as i64;
                // Seen at the next update after it is up.
                let seen = (up + update - 1).div_euclid(update) * update;
                self.booting.push(Reverse(seen.max(up)));
            }
            return;
        }
        let mut surplus = live - want;
        while surplus > 0 && self.idle.len() >= c as usize && self.ready_instances > 0 {
            let Some(&oldest) = self.idle.front() else {
                break;
            };
            if self.now < oldest + k.idle_time_ms as i64 {
                break;
            }
            for _ in 0..c {
                self.idle.pop_front();
            }
            self.ready_instances -= 1;
            surplus -= 1;
        }
    }
}

fn figures(mut waits: Vec<u32>, zero: u64, timed_out: u64, instance_ms: f64) -> Figures {
    let n = waits.len() as u64 + zero;
    let pct = |waits: &mut Vec<u32>, p: f64| -> f64 {
        if n == 0 {
            return 0.0;
        }
        let rank = ((n - 1) as f64 * p).round() as u64;
        if rank < zero {
            return 0.0;
        }
        let i = (rank - zero) as usize;
        if i >= waits.len() {
            return 0.0;
        }
        let (_, v, _) = waits.select_nth_unstable(i);
        f64::from(*v) / 1000.0
    };
    let max = waits.iter().max().map_or(0.0, |&w| f64::from(w) / 1000.0);
    Figures {
        instance_hours: instance_ms / 3_600_000.0,
        wait_p50_s: pct(&mut waits, 0.5),
        wait_p95_s: pct(&mut waits, 0.95),
        wait_max_s: max,
        timed_out,
    }
}
