//! Scaling writes whose answer was lost: a resize, a capacity update or a desired count that
//! the cloud may have applied although the plugin never heard so (a reset, a 504 from a
//! proxy, a timeout). The host counted the call as failed and asks again for the same
//! instances; adding them on top of the write that took effect would pay for machines nobody
//! asked for. The plugin remembers the write until it is settled, and the next increase counts
//! what it already added.

use std::time::{Duration, Instant};

/// How long a write of unknown outcome is remembered: by then the host has listed the group
/// many times over, and anything it added is in the listing.
const REMEMBERED: Duration = Duration::from_secs(600);

/// The write whose answer was lost: the group's size before it, and the size it asked for.
#[derive(Debug, Clone, Copy)]
struct Write {
    from: u32,
    to: u32,
    at: Instant,
}

/// What an increase should do: write `target` (when it differs from the group's current
/// size), and tell the host it granted `granted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The size to write; equal to the current size when nothing needs writing.
    pub target: u32,
    /// Instances granted to the host: new ones plus those a lost write already added.
    pub granted: u32,
}

/// At most one scaling write whose outcome the plugin does not know.
#[derive(Debug, Default)]
pub struct Unsettled {
    write: Option<Write>,
}

impl Unsettled {
    /// Plans an increase of `delta` for a group of `current` size (its target, or what exists
    /// when more than that), at most `max`. A remembered write that took effect (the group is
    /// above the size it started from) covers as much of `delta` as it added; one that did not
    /// is forgotten.
    pub fn plan(&mut self, current: u32, delta: u32, max: u32) -> Plan {
        let covered = match self.write.take() {
            Some(w) if w.at.elapsed() < REMEMBERED => current
                .saturating_sub(w.from)
                .min(w.to.saturating_sub(w.from))
                .min(delta),
            _ => 0,
        };
        let target = current
            .saturating_add(delta - covered)
            .min(max)
            .max(current);
        Plan {
            target,
            granted: covered + (target - current),
        }
    }

    /// Sends the write from `from` to `to` with `send`, remembered until its answer comes: it
    /// stays unsettled when `send` fails with an error `lost` says may hide a write that took
    /// effect (a reset, a timeout, a 5xx, an unreadable answer).
    pub fn write<T, E>(
        &mut self,
        from: u32,
        to: u32,
        send: impl FnOnce() -> Result<T, E>,
        lost: impl FnOnce(&E) -> bool,
    ) -> Result<T, E> {
        self.begin(from, to);
        let answer = send();
        if !answer.as_ref().is_err_and(lost) {
            self.settle();
        }
        answer
    }

    /// Before a write from `from` to `to` is sent: until [`Unsettled::settle`], its outcome is
    /// unknown.
    fn begin(&mut self, from: u32, to: u32) {
        self.write = Some(Write {
            from,
            to,
            at: Instant::now(),
        });
    }

    /// The write's answer came: applied, or refused in words. Nothing is left to count.
    fn settle(&mut self) {
        self.write = None;
    }

    /// A listing showed `live` instances (neither deleting nor gone): once they reach the
    /// write's size, the host sees what it added and counts it itself.
    pub fn listed(&mut self, live: u32) {
        if self.write.is_some_and(|w| live >= w.to) {
            self.write = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_lost_write_an_increase_adds_up_to_the_maximum() {
        let mut u = Unsettled::default();
        assert_eq!(
            u.plan(3, 4, 5),
            Plan {
                target: 5,
                granted: 2
            }
        );
        assert_eq!(
            u.plan(6, 1, 5),
            Plan {
                target: 6,
                granted: 0
            },
            "above the maximum: never shrunk"
        );
    }

    /// The host asks again for the two a lost write added: granted, nothing written.
    #[test]
    fn a_lost_write_that_took_effect_covers_the_retry() {
        let mut u = Unsettled::default();
        u.begin(0, 2);
        assert_eq!(
            u.plan(2, 2, 10),
            Plan {
                target: 2,
                granted: 2
            }
        );
        // Counted once: the next increase adds.
        assert_eq!(
            u.plan(2, 1, 10),
            Plan {
                target: 3,
                granted: 1
            }
        );
        // Asked for more than it added: only the rest is written.
        u.begin(3, 4);
        assert_eq!(
            u.plan(4, 3, 10),
            Plan {
                target: 6,
                granted: 3
            }
        );
    }

    /// A write whose answer was lost stays remembered; one answered or refused in words does
    /// not.
    #[test]
    fn a_write_is_settled_unless_its_answer_was_lost() {
        let mut u = Unsettled::default();
        let lost = |e: &&str| *e == "reset";
        assert_eq!(u.write(0, 2, || Err::<(), _>("reset"), lost), Err("reset"));
        assert_eq!(u.plan(2, 2, 10).granted, 2);
        assert_eq!(u.plan(2, 2, 10).target, 4, "counted once");
        assert_eq!(u.write(4, 6, || Err::<(), _>("quota"), lost), Err("quota"));
        assert_eq!(
            u.plan(6, 1, 10).target,
            7,
            "a refusal took no effect to count"
        );
        assert_eq!(u.write(7, 8, || Ok::<(), &str>(()), lost), Ok(()));
        assert_eq!(u.plan(8, 1, 10).target, 9);
    }

    #[test]
    fn a_lost_write_that_did_not_take_effect_is_forgotten() {
        let mut u = Unsettled::default();
        u.begin(1, 3);
        assert_eq!(
            u.plan(1, 2, 10),
            Plan {
                target: 3,
                granted: 2
            }
        );
    }

    /// Once a listing shows what the write added, the host counts it: a later increase adds.
    #[test]
    fn a_listing_that_shows_the_write_settles_it() {
        let mut u = Unsettled::default();
        u.begin(0, 2);
        u.listed(1);
        u.listed(2);
        assert_eq!(
            u.plan(2, 2, 10),
            Plan {
                target: 4,
                granted: 2
            }
        );
        u.begin(4, 5);
        u.settle();
        assert_eq!(u.plan(5, 1, 10).target, 6);
    }
}
