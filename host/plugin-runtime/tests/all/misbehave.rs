use super::*;

fn provider(
    pool: &str,
    settings_sandbox: impl FnOnce(&mut Sandbox),
) -> flotilla_plugin_runtime::WasmProvider {
    let mut sandbox = quick_sandbox(&[]);
    settings_sandbox(&mut sandbox);
    load(guests::MISBEHAVE).provider(pool, sandbox)
}

async fn call(p: &impl Provider, f: Function) -> Result<(), CallError> {
    match f {
        Function::Init => unreachable!(),
        Function::Update => p.update().await.map(drop),
        Function::Increase => p.increase(1).await.map(drop),
        Function::Decrease => p.decrease(&["m-1".to_string()]).await.map(drop),
        Function::ConnectInfo => p.connect_info("m-1").await.map(drop),
        Function::Heartbeat => p.heartbeat("m-1").await,
        Function::Shutdown => p.shutdown().await,
    }
}

#[tokio::test]
async fn infinite_loop_hits_the_deadline() {
    let p = provider("loop", |s| {
        s.limits.default_deadline = Duration::from_millis(300)
    });
    must(p.init(r#"{"on":{"update":"loop"}}"#)).await;
    let start = Instant::now();
    let r = p.update().await;
    assert!(
        matches!(
            r,
            Err(CallError::Timeout {
                function: Function::Update,
                ..
            })
        ),
        "{r:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    // The next call runs in a fresh, re-initialised instance.
    assert_eq!(must(p.increase(2)).await, 2);
    assert_eq!(p.health().timeouts, 1);
    assert_eq!(p.health().restarts, 1);
}

/// On a single-threaded runtime, two guests spinning until their 2 s deadline leave the
/// thread to other tasks: guest code yields to the executor at every epoch tick, so a
/// ticker that wants to run every 10 ms is never held up by more than a few ticks.
#[tokio::test(flavor = "current_thread")]
async fn spinning_guests_do_not_starve_the_executor() {
    let spinners: Vec<_> = ["spin-a", "spin-b"]
        .into_iter()
        .map(|name| provider(name, |s| s.limits.default_deadline = Duration::from_secs(2)))
        .collect();
    for p in &spinners {
        must(p.init(r#"{"on":{"update":"loop"}}"#)).await;
    }
    let ticker = async {
        let mut worst = Duration::ZERO;
        let mut last = Instant::now();
        let end = last + Duration::from_millis(1500);
        while Instant::now() < end {
            // Deliberate: the ticker's own period.
            tokio::time::sleep(Duration::from_millis(10)).await;
            let now = Instant::now();
            worst = worst.max(now - last);
            last = now;
        }
        worst
    };
    let spins = futures_util::future::join_all(spinners.iter().map(|p| p.update()));
    let (worst, results) = tokio::join!(ticker, spins);
    for r in results {
        assert!(
            matches!(
                r,
                Err(CallError::Timeout {
                    function: Function::Update,
                    ..
                })
            ),
            "{r:?}"
        );
    }
    assert!(
        worst < Duration::from_millis(60),
        "the executor was held for {worst:?} by spinning guests"
    );
}

#[tokio::test]
async fn waiting_on_host_io_hits_the_deadline() {
    // Epochs do not fire while the guest blocks in a host call; the tokio timeout must.
    let p = provider("sleep", |s| {
        s.limits.default_deadline = Duration::from_millis(300)
    });
    must(p.init(r#"{"on":{"heartbeat":"sleep"}}"#)).await;
    let start = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(10), p.heartbeat("x")).await;
    assert!(matches!(r, Ok(Err(CallError::Timeout { .. }))), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
    must(p.update()).await;
}

#[tokio::test]
async fn allocation_past_the_cap_traps() {
    let p = provider("alloc", |s| s.limits.memory_bytes = 48 << 20);
    must(p.init(r#"{"on":{"update":"alloc"}}"#)).await;
    let r = p.update().await;
    let Err(CallError::Trap { message, .. }) = &r else {
        panic!("expected a trap, got {r:?}")
    };
    assert!(message.contains("memory cap exceeded"), "{message}");
    must(p.increase(1)).await;
}

#[tokio::test]
async fn trap_or_panic_in_each_export_is_contained() {
    let other = bystander().await;
    for fault in ["trap", "panic"] {
        for f in Function::ALL.into_iter().filter(|f| *f != Function::Init) {
            let p = provider("faulty", |_| {});
            must(p.init(&format!(r#"{{"on":{{"{}":"{fault}"}}}}"#, f.name()))).await;
            let r = call(&p, f).await;
            assert!(
                matches!(&r, Err(CallError::Trap { function, .. }) if *function == f),
                "{fault} in {f}: {r:?}"
            );
            // Another export of the same pool works in a fresh instance...
            let healthy = if f == Function::Update {
                Function::Increase
            } else {
                Function::Update
            };
            call(&p, healthy)
                .await
                .unwrap_or_else(|e| panic!("after {fault} in {f}: {e}"));
            // ...and so does another plugin in the same process.
            assert_bystander_works(&other).await;
        }
        let p = provider("faulty-init", |_| {});
        let r = p.init(&format!(r#"{{"on":{{"init":"{fault}"}}}}"#)).await;
        assert!(
            matches!(
                r,
                Err(CallError::Trap {
                    function: Function::Init,
                    ..
                })
            ),
            "{r:?}"
        );
        assert!(matches!(
            p.update().await,
            Err(CallError::NotInitialized { .. })
        ));
    }
}

/// A panic's own words (what the guest wrote to stderr) head the trap's message, above
/// the wasm backtrace, so an author sees the panic, a Python traceback or a JS stack.
#[tokio::test]
async fn a_panic_reports_the_guests_last_stderr_lines_above_the_backtrace() {
    let p = provider("words", |_| {});
    must(p.init(r#"{"on":{"update":"panic"}}"#)).await;
    let r = p.update().await;
    let Err(CallError::Trap { message, .. }) = &r else {
        panic!("expected a trap, got {r:?}")
    };
    let words = message
        .find("misbehave: panic in update")
        .unwrap_or_else(|| panic!("the panic message is missing: {message}"));
    let backtrace = message.find("wasm backtrace").unwrap_or(usize::MAX);
    assert!(
        message.starts_with("guest stderr (last ") && words < backtrace,
        "{message}"
    );
    assert_eq!(
        p.health()
            .last_fault
            .as_deref()
            .map(|f| f.contains("misbehave: panic in update")),
        Some(true)
    );
}

#[tokio::test]
async fn a_trap_poisons_only_its_own_store() {
    let plugin = load(guests::MISBEHAVE);
    let a = plugin.provider("a", quick_sandbox(&[]));
    let b = plugin.provider("b", quick_sandbox(&[]));
    must(a.init(r#"{"trap_on_delta":13}"#)).await;
    must(b.init(r#"{"trap_on_delta":13}"#)).await;
    must(a.increase(2)).await;
    must(b.increase(2)).await;
    assert!(matches!(a.increase(13).await, Err(CallError::Trap { .. })));
    // a's instance was replaced: its in-memory group starts empty again; b keeps its state.
    assert_eq!(must(a.update()).await.instances.len(), 0);
    assert_eq!(must(b.update()).await.instances.len(), 2);
}

#[tokio::test]
async fn repeated_faults_open_the_circuit() {
    let logs = LogCapture::default();
    let _guard = logs.install();
    let p = provider("flaky", |s| {
        s.limits.circuit_threshold = 3;
        s.limits.circuit_cooldown = Duration::from_millis(400);
    });
    must(p.init(r#"{"on":{"update":"trap"}}"#)).await;
    for _ in 0..3 {
        assert!(matches!(p.update().await, Err(CallError::Trap { .. })));
    }
    let h = p.health();
    assert!(
        h.circuit_open && h.consecutive_faults == 3 && h.traps == 3,
        "{h:?}"
    );
    let r = p.increase(1).await;
    assert!(
        matches!(r, Err(CallError::CircuitOpen { faults: 3, .. })),
        "{r:?}"
    );
    // Deliberate: waits out the circuit's cool-down, the behaviour under test.
    tokio::time::sleep(Duration::from_millis(450)).await;
    must(p.increase(1)).await;
    assert!(!p.health().circuit_open);
    assert!(
        logs.text().contains("plugin fault"),
        "faults are reported in the log"
    );
}

/// A plugin that writes its state in a loop is refused after the per-call budget, and the
/// next call gets a fresh one: each write is a durable commit to the file the lease
/// journal shares.
#[tokio::test]
async fn state_writes_are_bounded_per_call() {
    let p = provider("flood", |_| {});
    must(p.init(r#"{"on":{"update":"state-flood"}}"#)).await;
    for _ in 0..2 {
        let e = p.update().await;
        assert!(
            matches!(&e, Err(CallError::Provider { error: ProviderError::Transient(m), .. })
                if m.contains("refused after 64 writes") && m.contains("per call")),
            "{e:?}"
        );
    }
}

/// After a trap the next call re-instantiates the plugin and calls `init` again; an `init`
/// that then blocks is cut at the init deadline, counted as a timeout and fed to the
/// circuit, so the pool neither wedges nor hides it.
#[tokio::test]
async fn a_re_instantiation_that_blocks_is_cut_counted_and_trips_the_circuit() {
    let p = provider("wedge", |s| {
        s.limits.circuit_threshold = 3;
        s.limits.circuit_cooldown = Duration::from_secs(60);
        s.limits
            .deadlines
            .insert(Function::Init, Duration::from_millis(500));
    });
    must(p.init(r#"{"on":{"update":"trap"},"again":{"init":"sleep"}}"#)).await;
    assert!(matches!(p.update().await, Err(CallError::Trap { .. })));
    for round in 0..2 {
        let start = std::time::Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(5), p.update())
            .await
            .unwrap_or_else(|_| panic!("round {round}: the re-instantiation wedged the call"));
        assert!(
            matches!(
                r,
                Err(CallError::Timeout {
                    function: Function::Init,
                    ..
                })
            ),
            "round {round}: {r:?}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    }
    let h = p.health();
    assert_eq!((h.traps, h.timeouts), (1, 2), "{h:?}");
    assert!(h.circuit_open, "{h:?}");
    assert!(matches!(
        p.update().await,
        Err(CallError::CircuitOpen { .. })
    ));
}

#[tokio::test]
async fn a_plugin_that_alternates_success_and_fault_still_trips_the_circuit() {
    let p = provider("alternating", |s| {
        s.limits.circuit_threshold = 3;
        s.limits.circuit_cooldown = Duration::from_secs(60);
    });
    must(p.init(r#"{"on":{"update":"trap"}}"#)).await;
    for round in 0..3 {
        assert!(
            matches!(p.update().await, Err(CallError::Trap { .. })),
            "round {round}"
        );
        if round < 2 {
            must(p.increase(1)).await;
        }
    }
    let h = p.health();
    assert!(h.circuit_open, "3 faults among the last 6 calls: {h:?}");
    assert!(matches!(
        p.increase(1).await,
        Err(CallError::CircuitOpen { .. })
    ));
}

#[tokio::test]
async fn contract_violations_are_not_forwarded() {
    let p = provider("liar", |_| {});
    must(p.init(
        r#"{"on":{"update":"dup-ids","increase":"over-increase","decrease":"foreign-ids"}}"#,
    ))
    .await;
    let r = p.increase(2).await;
    assert!(
        matches!(
            &r,
            Err(CallError::ContractViolation {
                function: Function::Increase,
                ..
            })
        ),
        "{r:?}"
    );
    let r = p.update().await;
    assert!(
        matches!(&r, Err(CallError::ContractViolation { detail, .. }) if detail.contains("twice")),
        "{r:?}"
    );
    let r = p.decrease(&["m-1".to_string()]).await;
    assert!(
        matches!(&r, Err(CallError::ContractViolation { detail, .. }) if detail.contains("never-asked-for")),
        "{r:?}"
    );
    assert_eq!(p.health().contract_violations, 3);
}

#[tokio::test]
async fn oversized_answers_are_contract_violations_not_host_state() {
    let other = bystander().await;
    for (fault, expect) in [("huge-list", "at most 10000"), ("long-id", "at most 256")] {
        let p = provider(fault, |s| {
            s.limits.memory_bytes = 256 << 20;
            s.limits.default_deadline = Duration::from_secs(20);
        });
        must(p.init(&format!(r#"{{"on":{{"update":"{fault}"}}}}"#))).await;
        let r = p.update().await;
        assert!(
            matches!(&r, Err(CallError::ContractViolation { detail, .. }) if detail.contains(expect)),
            "{fault}: {:?}",
            r.as_ref().map(|l| l.instances.len())
        );
    }
    assert_bystander_works(&other).await;
}

/// Header sets live in host memory, outside `memory_bytes`: one over `http_fields_bytes` is
/// refused, and the number held is capped by `resource_entries`, so the host memory a
/// guest can take this way is bounded (here 500 × 16 KiB) and the fault is contained.
#[tokio::test(flavor = "current_thread")]
async fn host_side_http_memory_is_bounded() {
    let logs = LogCapture::default();
    let _guard = logs.install();
    let other = bystander().await;
    let p = provider("fields", |s| {
        s.limits.resource_entries = 500;
        s.limits.default_deadline = Duration::from_secs(20);
    });
    must(p.init(r#"{"on":{"update":"fields-flood"}}"#)).await;
    let r = p.update().await;
    let text = logs.text();
    let most = text
        .lines()
        .filter_map(|l| l.split("header sets held: ").nth(1))
        .filter_map(|n| {
            n.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u32>()
                .ok()
        })
        .max()
        .unwrap_or(0);
    assert!((100..=500).contains(&most), "held {most}: {r:?}");
    // Refused by the table: a trap, and the instance (with everything it held) is discarded.
    assert!(
        matches!(&r, Err(CallError::Trap { message, .. }) if message.contains("resource table has no free keys")),
        "{r:?}"
    );
    assert_eq!(
        must(p.increase(1)).await,
        1,
        "the next call gets a fresh instance"
    );

    let p = provider("fields-big", |_| {});
    must(p.init(r#"{"on":{"update":"fields-oversized"}}"#)).await;
    let r = p.update().await;
    assert!(
        matches!(&r, Err(CallError::Trap { message, .. }) if message.contains("fields exceeds limit")),
        "{r:?}"
    );
    assert_bystander_works(&other).await;
}

#[tokio::test(flavor = "current_thread")]
async fn guest_text_is_capped_and_cannot_forge_host_log_lines() {
    let logs = LogCapture::default();
    let _guard = logs.install();
    let p = provider("forger", |_| {});
    must(p.init(r#"{"on":{"update":"log-forge"}}"#)).await;
    must(p.update()).await;
    let p = provider("shouter", |_| {});
    must(p.init(r#"{"on":{"update":"long-error"}}"#)).await;
    let r = p.update().await;
    let Err(CallError::Provider {
        error: ProviderError::Transient(message),
        ..
    }) = &r
    else {
        panic!("{r:?}")
    };
    assert!(message.len() < 4_096, "{} bytes kept", message.len());
    assert!(!message.contains('\n'), "control characters are escaped");
    let text = logs.text();
    assert!(
        text.contains("forged: pool stopped"),
        "the line is logged, escaped"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("2026-01-01T00:00:00Z")),
        "a guest forged a host log line:\n{text}"
    );
}
