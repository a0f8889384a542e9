//! Fallback pools (`[[pool]] fallback = "..."`): while a pool cannot grow (a quota or capacity
//! refusal, or instances the cloud takes back soon after they came), the reservations it will
//! not serve go to its fallback, whole and under the same id; the lease API keeps answering
//! for them under the first pool's name ([`crate::api`] finds them there). When the pool can
//! grow again, new reservations stay in it, and the fallback drains by its own idle policy.

use std::sync::Arc;
use std::time::Duration;

use crate::api::AppState;

/// How often a pair is looked at when nothing wakes it (a pool change wakes it at once).
const TICK: Duration = Duration::from_secs(1);

/// How often the same refusal of the fallback is logged again.
const REPEAT_EVERY: Duration = Duration::from_secs(60);

/// One steward per pool that names a fallback; their tasks, to abort at the drain.
pub fn spawn_stewards(
    pools: &[crate::config::Pool],
    state: &Arc<AppState>,
) -> Vec<tokio::task::JoinHandle<()>> {
    pools
        .iter()
        .filter_map(|pool| {
            let fallback = pool.fallback.clone()?;
            let steward = steward(state.clone(), pool.name.clone(), fallback);
            Some(tokio::spawn(steward))
        })
        .collect()
}

/// Hands `pool`'s waiting reservations to `fallback` while `pool` cannot grow, for as long as
/// the process runs; waits while either pool is not running.
pub async fn steward(state: Arc<AppState>, pool: String, fallback: String) {
    let mut checked_twice = false;
    let mut was_blocked = false;
    // A full fallback refuses at every tick: said again only when the refusal changes, or
    // once a minute.
    let mut said: Option<(String, std::time::Instant)> = None;
    loop {
        let (Ok(first), Ok(second)) = (state.pools.get(&pool), state.pools.get(&fallback)) else {
            tokio::time::sleep(TICK).await;
            continue;
        };
        if !checked_twice {
            // The series exists from the start, at 0, for dashboards and rate().
            state.metrics.handed_over(&pool, &fallback, 0);
            // A crash between the two journal writes of a hand-over leaves it in both pools.
            let dropped = second.handle.drop_handed_twice(&first.handle);
            if !dropped.is_empty() {
                tracing::info!(pool = %pool, fallback = %fallback, leases = ?dropped, "reservations found in both pools after a restart are kept in the first");
            }
            checked_twice = true;
        }
        let blocked = first.handle.cannot_grow();
        state.metrics.set_cannot_grow(&pool, blocked.is_some());
        match (&blocked, was_blocked) {
            (Some(why), false) => {
                tracing::warn!(pool = %pool, fallback = %fallback, reason = %why, "the pool cannot grow; its waiting reservations go to its fallback")
            }
            (None, true) => {
                tracing::info!(pool = %pool, fallback = %fallback, "the pool can grow again; new reservations stay in it")
            }
            _ => {}
        }
        was_blocked = blocked.is_some();
        let (handed, stopped) = first.handle.fall_back(&second.handle);
        if !handed.is_empty() {
            state
                .metrics
                .handed_over(&pool, &fallback, handed.len() as u64);
            tracing::info!(pool = %pool, fallback = %fallback, leases = ?handed, "reservations handed to the fallback pool");
        }
        if let Some(e) = stopped {
            let e = e.to_string();
            let again = said
                .as_ref()
                .is_none_or(|(last, at)| *last != e || at.elapsed() >= REPEAT_EVERY);
            if again {
                tracing::warn!(pool = %pool, fallback = %fallback, "the fallback pool took no more reservations: {e}");
                said = Some((e, std::time::Instant::now()));
            }
        }
        // A change that came while looking is seen at the next tick at the latest.
        let _ = tokio::time::timeout(TICK, first.handle.changed()).await;
    }
}
