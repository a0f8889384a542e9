//! The lease table and its indexes: by id, by label (one live lease per `key=value`), and by
//! deadline (TTL expiry or maximum job duration), so that reserving with labels, planning and
//! waking up cost O(log n) in the number of leases rather than a scan. It owns how a lease is
//! indexed; it must not know what a lease means to slots or instances (that is `leases`).

use std::collections::{BTreeSet, HashMap};

use super::{Lease, LeaseState};
use crate::Millis;

/// Leases by id, with the label and deadline indexes kept in step by every change.
#[derive(Debug, Default)]
pub(super) struct LeaseTable {
    leases: HashMap<u64, Lease>,
    by_label: HashMap<(String, String), u64>,
    deadlines: BTreeSet<(Millis, u64)>,
    /// The pool's maximum job duration, part of an acquired lease's deadline.
    max_job_ms: Option<Millis>,
}

/// When a lease must end: its TTL expiry, its acquisition plus the maximum job duration, or
/// its holder's own deadline, whichever is first; a failed lease has none.
pub(super) fn deadline(lease: &Lease, max_job_ms: Option<Millis>) -> Option<Millis> {
    if matches!(lease.state, LeaseState::Failed { .. }) {
        return None;
    }
    let job = match (&lease.state, lease.acquired_at, max_job_ms) {
        (LeaseState::Acquired { .. }, Some(at), Some(max)) => Some(at.saturating_add(max)),
        _ => None,
    };
    [lease.expires_at, job, lease.deadline_at]
        .into_iter()
        .flatten()
        .min()
}

impl LeaseTable {
    /// An empty table for a pool with this maximum job duration.
    pub(super) fn new(max_job_ms: Option<Millis>) -> LeaseTable {
        LeaseTable {
            max_job_ms,
            ..LeaseTable::default()
        }
    }

    pub(super) fn get(&self, id: u64) -> Option<&Lease> {
        self.leases.get(&id)
    }

    pub(super) fn contains(&self, id: u64) -> bool {
        self.leases.contains_key(&id)
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Lease> {
        self.leases.values()
    }

    pub(super) fn len(&self) -> usize {
        self.leases.len()
    }

    /// Adds (or replaces) a lease.
    pub(super) fn insert(&mut self, lease: Lease) {
        self.remove(lease.id);
        self.index(&lease);
        self.leases.insert(lease.id, lease);
    }

    /// Takes a lease out.
    pub(super) fn remove(&mut self, id: u64) -> Option<Lease> {
        let lease = self.leases.remove(&id)?;
        self.unindex(&lease);
        Some(lease)
    }

    /// Changes a lease with `f` and indexes it again.
    pub(super) fn update<T>(&mut self, id: u64, f: impl FnOnce(&mut Lease) -> T) -> Option<T> {
        let mut lease = self.remove(id)?;
        let out = f(&mut lease);
        self.insert(lease);
        Some(out)
    }

    /// Every lease, emptying the table.
    pub(super) fn drain(&mut self) -> Vec<Lease> {
        self.by_label.clear();
        self.deadlines.clear();
        self.leases.drain().map(|(_, l)| l).collect()
    }

    /// The lease holding the label `key=value`.
    pub(super) fn by_label(&self, key: &str, value: &str) -> Option<&Lease> {
        // The index is keyed by owned pairs; a lookup costs one allocation per label, which is
        // small next to the scan it replaces.
        let id = self.by_label.get(&(key.to_string(), value.to_string()))?;
        self.leases.get(id)
    }

    /// The earliest deadline of any lease.
    pub(super) fn next_deadline(&self) -> Option<Millis> {
        self.deadlines.first().map(|&(at, _)| at)
    }

    /// The leases whose deadline is at or before `now`, earliest first.
    pub(super) fn due(&self, now: Millis) -> impl Iterator<Item = &Lease> {
        self.deadlines
            .range(..=(now, u64::MAX))
            .filter_map(|(_, id)| self.leases.get(id))
    }

    fn index(&mut self, lease: &Lease) {
        for (key, value) in &lease.labels {
            self.by_label.insert((key.clone(), value.clone()), lease.id);
        }
        if let Some(at) = deadline(lease, self.max_job_ms) {
            self.deadlines.insert((at, lease.id));
        }
    }

    fn unindex(&mut self, lease: &Lease) {
        for (key, value) in &lease.labels {
            let pair = (key.clone(), value.clone());
            if self.by_label.get(&pair) == Some(&lease.id) {
                self.by_label.remove(&pair);
            }
        }
        if let Some(at) = deadline(lease, self.max_job_ms) {
            self.deadlines.remove(&(at, lease.id));
        }
    }

    /// Checks that the indexes match the leases (tests call it after every step).
    pub(super) fn check(&self) -> Result<(), String> {
        let mut deadlines = BTreeSet::new();
        for lease in self.leases.values() {
            for (key, value) in &lease.labels {
                if !self
                    .by_label
                    .get(&(key.clone(), value.clone()))
                    .is_some_and(|id| self.leases.contains_key(id))
                {
                    return Err(format!(
                        "label {key}={value} of lease {} not indexed",
                        lease.id
                    ));
                }
            }
            if let Some(at) = deadline(lease, self.max_job_ms) {
                deadlines.insert((at, lease.id));
            }
        }
        if deadlines != self.deadlines {
            return Err(format!(
                "deadline index has {} entries, leases have {}",
                self.deadlines.len(),
                deadlines.len()
            ));
        }
        if let Some((pair, id)) = self
            .by_label
            .iter()
            .find(|(_, id)| !self.leases.contains_key(id))
        {
            return Err(format!("label {}={} names gone lease {id}", pair.0, pair.1));
        }
        Ok(())
    }
}
