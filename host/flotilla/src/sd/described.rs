//! What the plugin said of each machine of a pool without a connector, so the machine list
//! gives its address, os, arch and zone too. A pool with `[pool.connector]` reads its
//! readiness checks' answers instead (`Connector::described`).
//!
//! The answers come from the pool's acquires (each asks `connect-info`), and from one
//! `connect-info` per machine that no acquire has asked about yet: a background task asks for
//! one machine at a time, at most one a second, so the list never costs a cloud request per
//! scrape and never takes more than a small share of the plugin's egress budget from the
//! acquires. A failed answer is asked for again after [`RETRY`].
//!
//! Owns: the answers kept and when to ask. Must not know: the SD answer's shape.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_provider::Connection;
use flotilla_scaler::PoolHandle;
use flotilla_scaler::core::InstState;
use parking_lot::Mutex;

/// The pace of the background asks: one machine per tick.
const TICK: Duration = Duration::from_secs(1);

/// How long a machine whose `connect-info` failed waits before it is asked again.
pub const RETRY: Duration = Duration::from_secs(60);

/// What is known of one machine.
#[derive(Clone)]
enum Entry {
    /// The plugin's last answer.
    Known(Connection),
    /// The last ask failed at this moment.
    Failed(Instant),
}

/// The answers kept for one pool's machines.
#[derive(Default)]
pub struct Described {
    kept: Mutex<HashMap<String, Entry>>,
}

impl Described {
    /// Keeps an answer the pool got (an acquire's).
    pub fn keep(&self, instance: &str, connection: &Connection) {
        self.kept
            .lock()
            .insert(instance.to_string(), Entry::Known(connection.clone()));
    }

    /// The last answer for `instance`, when there is one.
    pub fn get(&self, instance: &str) -> Option<Connection> {
        match self.kept.lock().get(instance) {
            Some(Entry::Known(c)) => Some(c.clone()),
            _ => None,
        }
    }

    /// The next machine to ask about among `live`: one with no answer, and no failure within
    /// [`RETRY`] of `now`. Forgets the machines that are not in `live` any more.
    fn next(&self, live: &[String], now: Instant) -> Option<String> {
        let mut kept = self.kept.lock();
        kept.retain(|id, _| live.contains(id));
        live.iter()
            .find(|id| match kept.get(*id) {
                None => true,
                Some(Entry::Known(_)) => false,
                Some(Entry::Failed(at)) => now.duration_since(*at) >= RETRY,
            })
            .cloned()
    }

    /// Asks the plugin about the pool's machines that have none, one per [`TICK`], for as
    /// long as the pool runs (the caller aborts it with the pool).
    pub async fn keep_asking(self: Arc<Self>, pool: Arc<PoolHandle>) {
        loop {
            tokio::time::sleep(TICK).await;
            let live: Vec<String> = pool.with_core(|c| {
                c.instances()
                    .into_iter()
                    .filter(|v| {
                        matches!(
                            v.state,
                            InstState::Running | InstState::Ready | InstState::Draining
                        )
                    })
                    .map(|v| v.id)
                    .collect()
            });
            let Some(instance) = self.next(&live, Instant::now()) else {
                continue;
            };
            let entry = match pool.connect_info(&instance).await {
                Ok(connection) => Entry::Known(connection),
                Err(e) => {
                    tracing::debug!(%instance, "connect-info for the machine list failed: {e}");
                    Entry::Failed(Instant::now())
                }
            };
            self.kept.lock().insert(instance, entry);
        }
    }
}

/// A task that ends when this is dropped.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection(id: &str) -> Connection {
        Connection {
            id: id.to_string(),
            os: flotilla_provider::Os::Linux,
            arch: flotilla_provider::Arch::Amd64,
            protocol: flotilla_provider::Protocol::Ssh,
            internal_address: Some("10.0.0.5".into()),
            external_address: None,
            port: 22,
            username: "ci".into(),
            expires: None,
            zone: None,
        }
    }

    /// One ask per machine: a described machine is never asked again, a failed one only after
    /// [`RETRY`], and a machine that left the pool is forgotten.
    #[test]
    fn each_machine_is_asked_once_and_a_failure_waits_for_the_retry() {
        let d = Described::default();
        let live = vec!["a".to_string(), "b".to_string()];
        let t0 = Instant::now();
        assert_eq!(d.next(&live, t0).as_deref(), Some("a"));
        d.keep("a", &connection("a"));
        assert_eq!(d.next(&live, t0).as_deref(), Some("b"));
        d.kept.lock().insert("b".into(), Entry::Failed(t0));
        assert_eq!(d.next(&live, t0 + RETRY / 2), None);
        assert_eq!(d.next(&live, t0 + RETRY).as_deref(), Some("b"));
        assert!(d.get("a").is_some());
        assert_eq!(d.next(&["b".to_string()], t0), None);
        assert!(d.get("a").is_none(), "a machine that left is forgotten");
    }
}
