//! The conformance kit's guest through the runtime alone: with `"flaw": "none"` it follows the
//! contract, and each flaw the runtime can see in one answer is a contract violation the
//! runtime stops, not an answer it forwards. (The kit's own verdicts, one rule per flaw, are
//! the binary's tests: `host/flotilla/tests/all/cli.rs`, `plugin_kit`.)
use super::*;

async fn provider(flaw: &str) -> flotilla_plugin_runtime::WasmProvider {
    let p = load(guests::NONCONFORMING).provider("kit", Sandbox::default());
    must(p.init(&format!(r#"{{"flaw":"{flaw}"}}"#))).await;
    p
}

#[tokio::test]
async fn the_flawless_guest_follows_the_contract() {
    let p = provider("none").await;
    assert_eq!(must(p.increase(2)).await, 2);
    let ids: Vec<String> = must(p.update())
        .await
        .instances
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(ids, ["mem-1", "mem-2"]);
    assert_eq!(must(p.decrease(&ids[..1])).await, ids[..1]);
    // A second decrease of the same id is accepted again (idempotent).
    assert_eq!(must(p.decrease(&ids[..1])).await, ids[..1]);
    assert_eq!(p.health().contract_violations, 0);
}

#[tokio::test]
async fn each_flaw_in_one_answer_is_a_violation_the_runtime_stops() {
    let p = provider("increase-more").await;
    let r = p.increase(1).await;
    assert!(
        matches!(&r, Err(CallError::ContractViolation { function: Function::Increase, detail, .. }) if detail.contains("claims 2")),
        "{r:?}"
    );

    let p = provider("update-duplicate").await;
    must(p.increase(1)).await;
    let r = p.update().await;
    assert!(
        matches!(&r, Err(CallError::ContractViolation { detail, .. }) if detail.contains("\"mem-1\" is listed twice")),
        "{r:?}"
    );

    let p = provider("decrease-extra").await;
    must(p.increase(1)).await;
    let r = p.decrease(&["mem-1".to_string()]).await;
    assert!(
        matches!(&r, Err(CallError::ContractViolation { detail, .. }) if detail.contains("mem-not-asked")),
        "{r:?}"
    );

    // A flaw that needs two answers to see (a second decrease refused) is the kit's to catch:
    // each answer on its own is within the contract.
    let p = provider("decrease-not-idempotent").await;
    must(p.increase(1)).await;
    must(p.decrease(&["mem-1".to_string()])).await;
    let r = p.decrease(&["mem-1".to_string()]).await;
    assert!(
        matches!(
            &r,
            Err(CallError::Provider {
                error: ProviderError::NotFound(_),
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(p.health().contract_violations, 0);
}
