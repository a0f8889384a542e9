//! A guest whose start-up blocks on a host pollable: instantiation is bounded by the init
//! deadline, the fault is reported, and a bystander keeps working.
use super::*;

#[tokio::test]
async fn a_start_up_that_waits_on_the_host_is_cut_at_the_init_deadline() {
    let other = bystander().await;
    let p = load(guests::STALL_START).provider("stall", quick_sandbox(&[]));
    let start = Instant::now();
    let r = p.init("{}").await;
    assert!(
        matches!(
            r,
            Err(CallError::Timeout {
                function: Function::Init,
                ..
            })
        ),
        "{r:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(p.health().timeouts, 1);
    assert_bystander_works(&other).await;
}
