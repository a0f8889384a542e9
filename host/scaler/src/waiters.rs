//! The acquires waiting for a slot, first come first served. A freed slot goes to the oldest
//! waiter, handed over through its own channel, so a change wakes one caller, not all of them:
//! the cost of an event does not grow with the number of reservations waiting. It owns the
//! queue; it must not touch the pool's state (the driver grants under the core's lock).

use std::collections::{BTreeMap, HashMap};

use tokio::sync::oneshot;

use crate::core::{Binding, LeaseError};

/// What a waiter is told: its binding, or why its lease cannot be bound.
pub(crate) type Grant = Result<Binding, LeaseError>;

/// One waiting acquire.
#[derive(Debug)]
pub(crate) struct Waiter {
    /// The lease it wants bound.
    pub(crate) lease: u64,
    tx: oneshot::Sender<Grant>,
}

impl Waiter {
    /// Whether the caller stopped waiting (its future was dropped).
    pub(crate) fn gone(&self) -> bool {
        self.tx.is_closed()
    }

    /// Hands the answer over; gives it back when the caller is gone.
    pub(crate) fn answer(self, grant: Grant) -> Result<(), Grant> {
        self.tx.send(grant)
    }
}

/// The queue, by arrival, with the tickets of each lease (a lease that ends while queued is
/// answered at once, without a walk through the queue).
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    next: u64,
    queue: BTreeMap<u64, Waiter>,
    by_lease: HashMap<u64, Vec<u64>>,
    /// The core's expired-lease count at the last sweep for leases that expired while queued.
    pub(crate) expired_seen: u64,
}

impl Waiters {
    /// Queues an acquire of `lease`; its ticket number and where the answer will come.
    pub(crate) fn push(&mut self, lease: u64) -> (u64, oneshot::Receiver<Grant>) {
        let (tx, rx) = oneshot::channel();
        self.next += 1;
        self.queue.insert(self.next, Waiter { lease, tx });
        self.by_lease.entry(lease).or_default().push(self.next);
        (self.next, rx)
    }

    /// The oldest waiter's ticket.
    pub(crate) fn front(&self) -> Option<(u64, &Waiter)> {
        self.queue.first_key_value().map(|(t, w)| (*t, w))
    }

    /// Takes a waiter out by ticket; `None` when it was already answered.
    pub(crate) fn take(&mut self, ticket: u64) -> Option<Waiter> {
        let waiter = self.queue.remove(&ticket)?;
        if let Some(tickets) = self.by_lease.get_mut(&waiter.lease) {
            tickets.retain(|t| *t != ticket);
            if tickets.is_empty() {
                self.by_lease.remove(&waiter.lease);
            }
        }
        Some(waiter)
    }

    /// Takes out every waiter of a lease.
    pub(crate) fn take_lease(&mut self, lease: u64) -> Vec<Waiter> {
        let tickets = self.by_lease.remove(&lease).unwrap_or_default();
        tickets
            .into_iter()
            .filter_map(|t| self.queue.remove(&t))
            .collect()
    }

    /// Every (ticket, lease), oldest first: for the rare sweep after a lease expired.
    pub(crate) fn tickets(&self) -> Vec<(u64, u64)> {
        self.queue.iter().map(|(t, w)| (*t, w.lease)).collect()
    }

    /// How many wait.
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }
}
