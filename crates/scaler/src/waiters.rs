//! The acquires waiting for a slot, first come first served. A freed slot goes to the oldest
//! waiter, handed over through its own channel, so a change wakes one caller, not all of them:
//! the cost of an event does not grow with the number of reservations waiting. It owns the
//! queue; it must not touch the pool's state (the driver grants under the core's lock).

use std::collections::BTreeMap;
use std::collections::btree_map::OccupiedEntry;

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

/// The queue, by arrival.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    next: u64,
    queue: BTreeMap<u64, Waiter>,
}

impl Waiters {
    /// Queues an acquire of `lease`; its ticket number and where the answer will come.
    pub(crate) fn push(&mut self, lease: u64) -> (u64, oneshot::Receiver<Grant>) {
        let (tx, rx) = oneshot::channel();
        self.next += 1;
        self.queue.insert(self.next, Waiter { lease, tx });
        (self.next, rx)
    }

    /// The oldest waiter, to look at and then take out.
    pub(crate) fn front(&mut self) -> Option<OccupiedEntry<'_, u64, Waiter>> {
        self.queue.first_entry()
    }

    /// Takes a waiter out by ticket; `false` when it was already answered.
    pub(crate) fn cancel(&mut self, ticket: u64) -> bool {
        self.queue.remove(&ticket).is_some()
    }

    /// How many wait.
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }
}
