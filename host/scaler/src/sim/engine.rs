//! The simulation's event loop: a heap of timed events (instances coming up, crashing, provider
//! calls returning, jobs finishing) merged with the sorted arrivals, each followed by letting
//! waiting jobs reserve and acquire and the scaler plan. It owns the simulated cloud and the
//! job queues; it must not reach into the pool's state except through `PoolCore`'s methods.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use super::{Job, Rng, Sample, SimOptions, SimPool, SimReport};
use crate::Millis;
use crate::core::{Action, InstState, LeaseError, LeaseIds, LeaseState};
use flotilla_provider::{CallError, Function, Instance, InstanceState, ProviderError};

use super::side::{Side, Sides};

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// The core asked to be woken (`next_wakeup`); the number tells a superseded request apart.
    Wake(u64),
    /// A job arrives; the event time is its submit time.
    Submit(Waiting),
    /// The job holding this lease is done.
    Finish(u64),
    /// Instance `n` of side `s` is running.
    Up(usize, u64),
    /// Instance `n` of side `s` fails.
    Crash(usize, u64),
    Done(u64),
}

/// A job as the queues carry it: what they need of it, so no lookup into the trace is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Waiting {
    /// Absolute submit time (ms, virtual clock).
    submit_at: Millis,
    /// Run time once it has a slot (ms).
    duration: Millis,
}

enum Pending {
    Update,
    Increase(u32),
    Decrease(Vec<String>),
}

/// The pool jobs come to.
pub(super) const FIRST: usize = 0;
/// Its fallback, when it has one.
pub(super) const FALLBACK: usize = 1;

pub(super) struct Sim<'a> {
    jobs: &'a [Job],
    opts: &'a SimOptions,
    sides: Sides<'a>,
    rng: Rng,
    /// Events other than arrivals, by (time, sequence).
    heap: BinaryHeap<Reverse<(Millis, u64, Ev)>>,
    /// The trace's arrivals by submit time (ties in trace order), consumed from `next_arrival`.
    /// They are kept out of the heap: at equal times an arrival comes before any other event,
    /// as if it had been pushed first, and the heap stays as small as the work in progress.
    arrivals: Vec<Waiting>,
    next_arrival: usize,
    seq: u64,
    /// Provider calls in flight: the side that made each, and what it asked.
    calls: HashMap<u64, (usize, Pending)>,
    next_call: u64,
    /// The current minute of the run and the provider calls made in it.
    calls_minute: (Millis, u64),
    /// Jobs waiting for a reservation.
    to_reserve: VecDeque<Waiting>,
    /// Jobs holding a reservation and waiting for a slot: (job, lease, side).
    to_acquire: VecDeque<(Waiting, u64, usize)>,
    /// Leases of the running jobs, with their side.
    running: HashMap<u64, usize>,
    waits: Vec<Millis>,
    report: SimReport,
    /// The wake-up the loop waits for: (time, generation). An earlier request supersedes a
    /// later one, whose heap entry is then skipped when it comes up, so the heap holds at most
    /// one live wake-up and stale ones cost one pop each (not a settle each, nor a re-arm).
    wake: Option<(Millis, u64)>,
    submitted: usize,
    samples: Vec<Sample>,
    meter: Meter,
    work: Work,
}

/// What the loop did, for the tests of its cost.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Work {
    /// Events handled (each followed by a settle).
    pub(super) events: u64,
    /// The most entries the event heap held at once.
    pub(super) peak_heap: usize,
}

/// Running totals for cost, utilisation and the timeline.
#[derive(Debug, Default)]
struct Meter {
    /// The previous event's time.
    last: Millis,
    next_sample: Millis,
    sample_every: Millis,
    ready_slot_ms: f64,
    busy_slot_ms: f64,
}

impl<'a> Sim<'a> {
    pub(super) fn new(
        pool: SimPool<'a>,
        fallback: Option<SimPool<'a>>,
        jobs: &'a [Job],
        opts: &'a SimOptions,
    ) -> Self {
        let ids = LeaseIds::default();
        let sides = Sides {
            first: Side::new(&pool, opts.start_at, &ids),
            fallback: fallback.map(|p| Side::new(&p, opts.start_at, &ids)),
        };
        Sim {
            jobs,
            opts,
            rng: Rng(pool.cloud.seed),
            sides,
            heap: BinaryHeap::new(),
            arrivals: Vec::new(),
            next_arrival: 0,
            seq: 0,
            calls: HashMap::new(),
            next_call: 1,
            calls_minute: (0, 0),
            to_reserve: VecDeque::new(),
            to_acquire: VecDeque::new(),
            running: HashMap::new(),
            waits: Vec::with_capacity(jobs.len()),
            report: SimReport {
                jobs: jobs.len() as u64,
                ..SimReport::default()
            },
            wake: None,
            submitted: 0,
            samples: Vec::new(),
            meter: Meter::default(),
            work: Work::default(),
        }
    }

    fn push(&mut self, at: Millis, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, ev)));
        self.work.peak_heap = self.work.peak_heap.max(self.heap.len());
    }

    pub(super) fn run(self) -> (SimReport, Vec<Sample>) {
        let (report, samples, _) = self.run_counted();
        (report, samples)
    }

    /// Runs the trace; also says how much work the loop did.
    pub(super) fn run_counted(mut self) -> (SimReport, Vec<Sample>, Work) {
        let start = self.opts.start_at;
        self.arrivals = self
            .jobs
            .iter()
            .map(|job| Waiting {
                submit_at: start + job.submit_at,
                duration: job.duration,
            })
            .collect();
        // Stable: arrivals at the same time keep the trace's order.
        self.arrivals.sort_by_key(|w| w.submit_at);
        self.wake = Some((start, 0));
        self.push(start, Ev::Wake(0));
        let end_of_trace = start + self.jobs.iter().map(|j| j.submit_at).max().unwrap_or(0);
        self.meter.sample_every = match self.opts.samples {
            0 => Millis::MAX,
            n => (self
                .jobs
                .iter()
                .map(|j| j.submit_at + j.duration)
                .max()
                .unwrap_or(1)
                / n as u64)
                .max(1000),
        };
        self.meter.last = start;
        self.meter.next_sample = start;
        let mut now = start;
        while let Some((at, ev)) = self.next_event() {
            if let Ev::Wake(generation) = ev {
                if self.wake.is_none_or(|(_, live)| live != generation) {
                    continue;
                }
                self.wake = None;
            }
            now = at;
            self.work.events += 1;
            self.account(now);
            self.handle(now, ev);
            self.settle(now);
            if self.opts.check_invariants {
                for side in self.sides.iter() {
                    if let Err(e) = side.core.check_invariants() {
                        self.report
                            .invariant_violations
                            .push(format!("t={}ms: {e}", now - start));
                    }
                }
            }
            // Stop once the trace is done and nothing is running or waiting: idle instances
            // would otherwise be simulated forever.
            let idle =
                self.running.is_empty() && self.to_acquire.is_empty() && self.to_reserve.is_empty();
            if now >= end_of_trace && self.submitted == self.jobs.len() && idle {
                break;
            }
        }
        let work = self.work;
        let (report, samples) = self.finish(now);
        (report, samples, work)
    }

    /// Integrates cost and utilisation over `[last, now)` and takes the samples due.
    fn account(&mut self, now: Millis) {
        let dt = now.saturating_sub(self.meter.last) as f64;
        self.meter.last = now;
        if dt <= 0.0 {
            return;
        }
        let (mut ready_slots, mut acquired, mut instances) = (0, 0, 0);
        for side in self.sides.iter() {
            let ready =
                side.core.count_in(InstState::Ready) + side.core.count_in(InstState::Draining);
            ready_slots += ready * side.cfg.capacity_per_instance;
            acquired += side.core.acquired_slots();
            instances += side.cloud.len() as u32;
        }
        self.meter.ready_slot_ms += dt * f64::from(ready_slots);
        self.meter.busy_slot_ms += dt * f64::from(acquired);
        self.report.instance_seconds += dt * f64::from(instances) / 1000.0;
        while self.meter.next_sample <= now {
            self.samples.push(Sample {
                t_s: (self.meter.next_sample - self.opts.start_at) as f64 / 1000.0,
                instances,
                busy_slots: acquired,
                queued: (self.to_reserve.len() + self.to_acquire.len()) as u32,
            });
            self.meter.next_sample = self
                .meter
                .next_sample
                .saturating_add(self.meter.sample_every);
        }
    }

    /// The report at the end of the run, `now` being the last event's time.
    fn finish(mut self, now: Millis) -> (SimReport, Vec<Sample>) {
        self.report.span_s = (now - self.opts.start_at) as f64 / 1000.0;
        self.report.slot_utilisation = if self.meter.ready_slot_ms > 0.0 {
            self.meter.busy_slot_ms / self.meter.ready_slot_ms
        } else {
            0.0
        };
        self.waits.sort_unstable();
        let pct = |p: f64| -> f64 {
            if self.waits.is_empty() {
                return 0.0;
            }
            let i = ((self.waits.len() - 1) as f64 * p).round() as usize;
            // `i` is at most `len - 1` because `p` is at most 1.
            self.waits.get(i).map_or(0.0, |w| *w as f64 / 1000.0)
        };
        self.report.wait_p50_s = pct(0.5);
        self.report.wait_p95_s = pct(0.95);
        self.report.wait_max_s = self.waits.last().map_or(0.0, |w| *w as f64 / 1000.0);
        (self.report, self.samples)
    }

    /// The next arrival or the next queued event, whichever is first (an arrival on a tie).
    fn next_event(&mut self) -> Option<(Millis, Ev)> {
        let arrival = self.arrivals.get(self.next_arrival).copied();
        let queued = self.heap.peek().map(|Reverse((at, _, _))| *at);
        match (arrival, queued) {
            (Some(job), None) => {
                self.next_arrival += 1;
                Some((job.submit_at, Ev::Submit(job)))
            }
            (Some(job), Some(at)) if job.submit_at <= at => {
                self.next_arrival += 1;
                Some((job.submit_at, Ev::Submit(job)))
            }
            _ => self.heap.pop().map(|Reverse((at, _, ev))| (at, ev)),
        }
    }

    fn fail(&mut self, side: usize, function: Function) -> Option<CallError> {
        let cloud = self.sides.get(side).cloud_cfg;
        if cloud.failure_rate <= 0.0 || self.rng.unit() >= cloud.failure_rate {
            return None;
        }
        let error = if self.rng.unit() < cloud.throttle_share {
            ProviderError::Throttled {
                retry_after: std::time::Duration::from_secs(5),
                message: "slow down".into(),
            }
        } else {
            ProviderError::Transient("simulated 503".into())
        };
        Some(CallError::Provider { function, error })
    }

    fn handle(&mut self, now: Millis, ev: Ev) {
        match ev {
            Ev::Wake(_) => {}
            Ev::Submit(job) => {
                self.submitted += 1;
                self.to_reserve.push_back(job);
            }
            Ev::Finish(lease) => {
                if let Some(side) = self.running.remove(&lease) {
                    self.report.completed += 1;
                    // The lease is acquired or failed, so the release cannot be refused.
                    let _ = self.sides.get_mut(side).core.release(now, lease);
                }
            }
            Ev::Up(side, n) => {
                let side_now = self.sides.get_mut(side);
                let rate = side_now.cloud_cfg.instance_failure_rate;
                if let Some(inst) = side_now.cloud.get_mut(&n)
                    && inst.state == InstanceState::Creating
                {
                    inst.state = InstanceState::Running;
                    if rate > 0.0 && self.rng.unit() < rate {
                        let life = self.rng.range(60_000, 3_600_000);
                        self.push(now + life, Ev::Crash(side, n));
                    }
                }
            }
            Ev::Crash(side, n) => {
                if let Some(inst) = self.sides.get_mut(side).cloud.get_mut(&n) {
                    inst.state = InstanceState::Failed("simulated hardware failure".into());
                }
                // The core's next scheduled `update()` reports the failure.
            }
            Ev::Done(call) => self.finish_call(now, call),
        }
    }

    /// Whether the cloud of `side` is out of capacity at `now` (a stockout window).
    fn stocked_out(&self, side: usize, now: Millis) -> bool {
        let at = now.saturating_sub(self.opts.start_at);
        self.sides
            .get(side)
            .cloud_cfg
            .stockouts
            .iter()
            .any(|&(from, to)| (from..to).contains(&at))
    }

    fn finish_call(&mut self, now: Millis, call: u64) {
        let Some((side, pending)) = self.calls.remove(&call) else {
            return;
        };
        match pending {
            Pending::Update => {
                let failed = self.fail(side, Function::Update);
                let s = self.sides.get_mut(side);
                match failed {
                    Some(e) => s.core.on_update(now, Err(e)),
                    None => s.core.on_listed(now, s.cloud.values()),
                }
            }
            Pending::Increase(n) => {
                let result = match self.fail(side, Function::Increase) {
                    Some(e) => Err(e),
                    None if self.stocked_out(side, now) => Err(CallError::Provider {
                        function: Function::Increase,
                        error: ProviderError::QuotaExceeded("simulated stockout".into()),
                    }),
                    None => Ok(self.launch(side, now, n)),
                };
                self.sides.get_mut(side).core.on_increase(now, n, result);
            }
            Pending::Decrease(ids) => {
                let result = match self.fail(side, Function::Decrease) {
                    Some(e) => Err(e),
                    None => {
                        let cloud = &mut self.sides.get_mut(side).cloud;
                        Ok(ids
                            .iter()
                            .filter(|id| {
                                let n = id.strip_prefix("i-").and_then(|n| n.parse::<u64>().ok());
                                n.is_some_and(|n| cloud.remove(&n).is_some())
                            })
                            .cloned()
                            .collect())
                    }
                };
                self.sides.get_mut(side).core.on_decrease(now, &ids, result);
            }
        }
    }

    /// Creates up to `n` instances in the cloud of `side` (its maximum allowing); how many.
    fn launch(&mut self, side: usize, now: Millis, n: u32) -> u32 {
        let s = self.sides.get_mut(side);
        let room = match s.cloud_cfg.max_size {
            0 => n,
            m => m.saturating_sub(s.cloud.len() as u32).min(n),
        };
        let (lo, hi) = s.cloud_cfg.provisioning_delay_ms;
        let mut created = Vec::with_capacity(room as usize);
        for _ in 0..room {
            let k = s.next_inst;
            s.next_inst += 1;
            s.cloud.insert(
                k,
                Instance {
                    id: format!("i-{k}"),
                    state: InstanceState::Creating,
                },
            );
            created.push(k);
        }
        let alive: u32 = self.sides.iter().map(|s| s.cloud.len() as u32).sum();
        self.report.peak_instances = self.report.peak_instances.max(alive);
        for k in created {
            let delay = self.rng.range(lo, hi);
            self.push(now + delay, Ev::Up(side, k));
        }
        room
    }

    /// Lets jobs reserve and acquire, then lets the scaler plan, until nothing changes.
    fn settle(&mut self, now: Millis) {
        while self.settle_once(now) {}
        self.schedule_wake(now);
    }

    /// One round; true when an instance became ready, so waiting jobs should try again.
    fn settle_once(&mut self, now: Millis) -> bool {
        let timeout = self.sides.get(FIRST).cfg.instance_acquire_timeout_ms;
        // Jobs that waited too long give up.
        while let Some(&(job, lease, side)) = self.to_acquire.front() {
            if now.saturating_sub(job.submit_at) < timeout {
                break;
            }
            self.to_acquire.pop_front();
            // The lease is reserved or failed, so unreserving cannot be refused.
            let _ = self.sides.get_mut(side).core.unreserve(lease);
            self.report.timed_out += 1;
        }
        while let Some(&job) = self.to_reserve.front() {
            if now.saturating_sub(job.submit_at) >= timeout {
                self.to_reserve.pop_front();
                self.report.timed_out += 1;
                continue;
            }
            match self.sides.get_mut(FIRST).core.reserve(now) {
                Ok(lease) => {
                    self.to_reserve.pop_front();
                    self.to_acquire.push_back((job, lease, FIRST));
                }
                Err(LeaseError::AtCapacity(_)) | Err(LeaseError::NoIdleSlot) => break,
                Err(_) => {
                    self.to_reserve.pop_front();
                    self.report.timed_out += 1;
                }
            }
        }
        self.fall_back(now);
        self.acquire_waiting(now);
        // Leases whose instance failed under them: only after a core failed one.
        for side in 0..self.sides.len() {
            let s = self.sides.get_mut(side);
            let failed = s.core.counters.leases_failed;
            if failed != s.leases_failed_seen {
                s.leases_failed_seen = failed;
                self.release_failed(now, side);
            }
        }
        let mut again = false;
        for side in 0..self.sides.len() {
            again |= self.plan(now, side);
        }
        again
    }

    /// While the first pool cannot grow, hands the reservations it will not serve to its
    /// fallback, as the host's steward does.
    fn fall_back(&mut self, now: Millis) {
        let Sides {
            first,
            fallback: Some(fallback),
        } = &mut self.sides
        else {
            return;
        };
        if first.core.cannot_grow(now).is_none() {
            return;
        }
        for id in first.core.unserved() {
            let Some(mut lease) = first.core.lease(id).cloned() else {
                continue;
            };
            lease.handed_from = Some("first".into());
            if fallback.core.take_over(lease).is_err() {
                break;
            }
            // Reserved, so unreserving cannot be refused.
            let _ = first.core.unreserve(id);
            self.report.handed_over += 1;
            if let Some(entry) = self.to_acquire.iter_mut().find(|(_, l, _)| *l == id) {
                entry.2 = FALLBACK;
            }
        }
    }

    /// Binds waiting jobs to free slots, in order within each pool.
    fn acquire_waiting(&mut self, now: Millis) {
        let mut blocked = [false; 2];
        let mut i = 0;
        while let Some(&(job, lease, side)) = self.to_acquire.get(i) {
            if blocked.get(side).copied().unwrap_or(true) {
                if blocked.iter().take(self.sides.len()).all(|b| *b) {
                    break;
                }
                i += 1;
                continue;
            }
            match self.sides.get_mut(side).core.acquire(now, lease) {
                Ok(Some(_)) => {
                    self.to_acquire.remove(i);
                    self.waits.push(now.saturating_sub(job.submit_at));
                    self.running.insert(lease, side);
                    if side == FALLBACK {
                        self.report.served_by_fallback += 1;
                    }
                    self.push(now + job.duration, Ev::Finish(lease));
                }
                Ok(None) => {
                    if let Some(b) = blocked.get_mut(side) {
                        *b = true;
                    }
                    i += 1;
                }
                Err(_) => {
                    self.to_acquire.remove(i);
                    self.report.timed_out += 1;
                }
            }
        }
    }

    /// Releases the running jobs' leases of `side` whose instance failed under them.
    fn release_failed(&mut self, now: Millis, side: usize) {
        let core = &mut self.sides.get_mut(side).core;
        let failed: Vec<u64> = self
            .running
            .iter()
            .filter(|&(l, s)| {
                *s == side
                    && matches!(
                        core.lease(*l).map(|l| &l.state),
                        Some(LeaseState::Failed { .. })
                    )
            })
            .map(|(l, _)| *l)
            .collect();
        for lease in failed {
            self.running.remove(&lease);
            // A failed lease is always released (acknowledged).
            let _ = core.release(now, lease);
            self.report.failed += 1;
        }
    }

    /// Carries out what the scaler of `side` plans; true when an instance became ready.
    fn plan(&mut self, now: Millis, side: usize) -> bool {
        let mut again = false;
        for action in self.sides.get_mut(side).core.plan(now) {
            let call = self.next_call;
            self.next_call += 1;
            if matches!(
                action,
                Action::Update | Action::Increase(_) | Action::Decrease(_)
            ) {
                let minute = now / 60_000;
                if self.calls_minute.0 != minute {
                    self.calls_minute = (minute, 0);
                }
                self.calls_minute.1 += 1;
                self.report.max_calls_per_minute =
                    self.report.max_calls_per_minute.max(self.calls_minute.1);
            }
            let pending = match action {
                Action::Update => Pending::Update,
                Action::Increase(n) => {
                    self.report.scale_operations += 1;
                    Pending::Increase(n)
                }
                Action::Decrease(ids) => {
                    self.report.scale_operations += 1;
                    Pending::Decrease(ids)
                }
                Action::Heartbeat(id) => {
                    self.sides.get_mut(side).core.on_heartbeat(now, &id, Ok(()));
                    continue;
                }
                Action::Ping(id) => {
                    self.sides.get_mut(side).core.on_ping(now, &id, Ok(()));
                    continue;
                }
                Action::CheckReady(id) => {
                    self.sides.get_mut(side).core.on_ready(now, &id, Ok(()));
                    again = true;
                    continue;
                }
            };
            self.calls.insert(call, (side, pending));
            let latency = self.sides.get(side).cloud_cfg.api_latency_ms;
            self.push(now + latency, Ev::Done(call));
        }
        again
    }

    fn schedule_wake(&mut self, now: Millis) {
        let wake = self
            .sides
            .iter()
            .map(|s| s.core.next_wakeup(now))
            .min()
            .unwrap_or(Millis::MAX);
        if self.wake.is_none_or(|(at, _)| wake < at) {
            self.seq += 1;
            let generation = self.seq;
            self.wake = Some((wake, generation));
            self.push(wake, Ev::Wake(generation));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::SimCloud;
    use super::*;
    use crate::Policy;
    use crate::ScalerConfig;

    /// An overloaded trace: a job every 12 s, each 100-900 s long, for 8 slots.
    fn overload(n: u64) -> Vec<Job> {
        (0..n)
            .map(|i| Job {
                submit_at: i * 12_000,
                duration: 100_000 + (i * 7_919 % 800) * 1_000,
                tag: None,
            })
            .collect()
    }

    fn work(jobs: &[Job]) -> (SimReport, Work) {
        let cfg = ScalerConfig {
            capacity_per_instance: 2,
            max_instances: 4,
            instance_acquire_timeout_ms: 30_000,
            update_interval_ms: 30_000,
            ..ScalerConfig::default()
        };
        let policy = Policy::new(vec!["* * * * *".into()], "UTC", 2, 300_000, 0.0, 0, false)
            .unwrap_or_else(|e| panic!("{e:?}"));
        let cloud = SimCloud::default();
        let opts = SimOptions::default();
        let pool = SimPool {
            cfg: &cfg,
            policies: std::slice::from_ref(&policy),
            cloud: &cloud,
        };
        let (report, _, work) = Sim::new(pool, None, jobs, &opts).run_counted();
        (report, work)
    }

    #[test]
    fn under_overload_the_work_per_job_does_not_grow_with_the_trace() {
        let (small_report, small) = work(&overload(2_000));
        let (large_report, large) = work(&overload(20_000));
        assert!(
            large_report.timed_out > large_report.jobs / 2,
            "{large_report:?}"
        );
        assert!(
            small_report.timed_out > small_report.jobs / 2,
            "{small_report:?}"
        );
        // The heap holds the work in progress (running jobs, instances coming up, calls in
        // flight, the 2 s updates while instances are expected) and one wake-up, whatever the
        // trace's length.
        assert!(small.peak_heap <= 40, "{small:?}");
        assert_eq!(small.peak_heap, large.peak_heap, "{small:?} vs {large:?}");
        // Events per job stay flat: ten times the jobs, about ten times the events.
        let per_job = |w: Work, n: u64| w.events as f64 / n as f64;
        let (a, b) = (per_job(small, 2_000), per_job(large, 20_000));
        assert!(b < a * 1.1, "events per job grew from {a:.2} to {b:.2}");
    }
}
