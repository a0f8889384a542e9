//! The one way a test waits for a condition: ask again until it holds or the time is up, and
//! then fail naming what was awaited and what was last seen. A bare sleep guesses how long a
//! thing takes; a poll ends as soon as it is true.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often a poll asks.
pub const EVERY: Duration = Duration::from_millis(100);

/// Asks `probe` every [`EVERY`] until it answers `Ok`, and returns that value. After `limit`,
/// panics with `what` and the last `Err` (what was seen instead).
pub async fn until<T, E: std::fmt::Display, F, Fut>(what: &str, limit: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let start = Instant::now();
    loop {
        match probe().await {
            Ok(v) => return v,
            Err(seen) => {
                if start.elapsed() >= limit {
                    panic!("timed out after {limit:?} waiting for {what}; last seen: {seen}");
                }
            }
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// [`until`] for a condition that is cheap to check and needs no `await`: `seen` describes
/// the state when the check fails.
pub async fn until_true(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> bool,
    seen: impl Fn() -> String,
) {
    until(what, limit, || {
        let ok = check();
        let seen = if ok { String::new() } else { seen() };
        async move { if ok { Ok(()) } else { Err(seen) } }
    })
    .await
}

/// [`until`] on a thread without a runtime.
pub fn until_blocking<T, E: std::fmt::Display>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> Result<T, E>,
) -> T {
    let start = Instant::now();
    loop {
        match probe() {
            Ok(v) => return v,
            Err(seen) => {
                if start.elapsed() >= limit {
                    panic!("timed out after {limit:?} waiting for {what}; last seen: {seen}");
                }
            }
        }
        std::thread::sleep(EVERY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_poll_returns_as_soon_as_the_condition_holds() {
        let mut n = 0;
        let got = until("the third ask", Duration::from_secs(5), || {
            n += 1;
            let now = n;
            async move { if now >= 3 { Ok(now) } else { Err(now) } }
        })
        .await;
        assert_eq!(got, 3);
    }

    #[tokio::test]
    #[should_panic(expected = "waiting for never; last seen: still no")]
    async fn a_poll_that_times_out_names_what_it_waited_for_and_saw() {
        until::<(), _, _, _>("never", Duration::from_millis(250), || async {
            Err("still no")
        })
        .await;
    }
}
