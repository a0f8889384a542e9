//! `flotilla plugin test`: the conformance kit. It runs a plugin through the contract's rules
//! in the pool's real sandbox and says, rule by rule, PASS, FAIL or SKIP with the reason.
//!
//! Three groups of rules:
//! - **static**: the component loads (world, exports, only allowed imports), its size and
//!   compile time;
//! - **contract**, against the live cloud and harmless: `init` with the settings, `init`
//!   refusing unknown keys and naming every one of them, `update` stable and without
//!   duplicates, `connect-info` of an unknown id being `not-found`;
//! - **provision** (only when asked, since it creates a real instance): `increase(1)` grants
//!   at most 1, the instance shows and runs, has an address, answers `heartbeat` when
//!   advertised, `decrease` returns a subset of what was asked and is idempotent, and the
//!   instance goes away. Every instance created is removed even when a step fails or on
//!   Ctrl-C.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::{Duration, Instant};

use serde::Serialize;

use flotilla_plugin_runtime::LoadedPlugin;
use flotilla_provider::{CallError, InstanceState, Provider, ProviderError, ProviderInfo};

/// An id no cloud has: `connect-info` must say `not-found`, `decrease` must not accept it as
/// anything but gone.
pub const NO_SUCH_ID: &str = "flotilla-conformance-no-such-id";
/// Keys no plugin knows, added to the settings to test that `init` refuses them.
const UNKNOWN_KEYS: [&str; 2] = [
    "flotilla_conformance_unknown_a",
    "flotilla_conformance_unknown_b",
];

/// One rule's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Outcome {
    /// The plugin follows the rule.
    Pass,
    /// It does not.
    Fail,
    /// The rule was not tried; the reason says why.
    Skip,
}

/// One rule and what became of it.
#[derive(Debug, Clone, Serialize)]
pub struct RuleResult {
    /// Stable id, e.g. `decrease.idempotent`.
    pub rule: &'static str,
    /// The verdict.
    pub outcome: Outcome,
    /// Why, in a line.
    pub reason: String,
}

/// The whole run.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The plugin tested.
    pub plugin: String,
    /// Every rule, in order.
    pub rules: Vec<RuleResult>,
    /// Instances created and not confirmed gone at the end (empty when cleanup worked).
    pub left_behind: Vec<String>,
}

impl Report {
    /// Whether every rule passed or was skipped, and nothing was left behind.
    pub fn ok(&self) -> bool {
        self.left_behind.is_empty() && self.rules.iter().all(|r| r.outcome != Outcome::Fail)
    }

    /// The table for humans.
    pub fn render(&self) -> String {
        let mut out = format!("plugin: {}\n", self.plugin);
        let width = self.rules.iter().map(|r| r.rule.len()).max().unwrap_or(0);
        for r in &self.rules {
            let outcome = match r.outcome {
                Outcome::Pass => "PASS",
                Outcome::Fail => "FAIL",
                Outcome::Skip => "SKIP",
            };
            out.push_str(&format!("{outcome}  {:<width$}  {}\n", r.rule, r.reason));
        }
        if !self.left_behind.is_empty() {
            out.push_str(&format!(
                "LEFT BEHIND: {} (remove them by hand)\n",
                self.left_behind.join(", ")
            ));
        }
        let count = |o: Outcome| self.rules.iter().filter(|r| r.outcome == o).count();
        out.push_str(&format!(
            "{} passed, {} failed, {} skipped\n",
            count(Outcome::Pass),
            count(Outcome::Fail),
            count(Outcome::Skip)
        ));
        out
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct KitOptions {
    /// `init` settings (JSON text); without them only the static rules run.
    pub settings: Option<String>,
    /// Run the rules that create an instance.
    pub provision: bool,
    /// How long an instance may take to run, and to go away.
    pub timeout: Duration,
    /// How often `update` is polled while waiting.
    pub poll: Duration,
}

struct Kit {
    rules: Vec<RuleResult>,
    /// `update` answers seen, and the first id listed twice in one of them.
    updates: usize,
    duplicate: Option<String>,
}

impl Kit {
    /// Checks one `update` answer for an id listed twice (rule `update.unique`, judged over
    /// every answer of the run).
    fn saw(&mut self, list: &[flotilla_provider::Instance]) {
        self.updates += 1;
        let mut seen = BTreeSet::new();
        if self.duplicate.is_none() {
            self.duplicate = list
                .iter()
                .find(|i| !seen.insert(i.id.as_str()))
                .map(|i| i.id.clone());
        }
    }

    fn record(&mut self, rule: &'static str, outcome: Outcome, reason: impl Into<String>) {
        self.rules.push(RuleResult {
            rule,
            outcome,
            reason: reason.into(),
        });
    }
    fn pass(&mut self, rule: &'static str, reason: impl Into<String>) {
        self.record(rule, Outcome::Pass, reason);
    }
    fn fail(&mut self, rule: &'static str, reason: impl Into<String>) {
        self.record(rule, Outcome::Fail, reason);
    }
    fn skip(&mut self, rule: &'static str, reason: impl Into<String>) {
        self.record(rule, Outcome::Skip, reason);
    }
    fn check(&mut self, rule: &'static str, ok: bool, pass: impl Into<String>, fail: String) {
        if ok {
            self.pass(rule, pass);
        } else {
            self.fail(rule, fail);
        }
    }
}

/// The rules of a loaded plugin (static rules from its load, the rest by calling it).
pub async fn run(
    plugin: &LoadedPlugin,
    label: &str,
    provider: &(impl Provider + ?Sized),
    options: &KitOptions,
    interrupted: impl Future<Output = ()>,
) -> Report {
    let mut kit = Kit {
        rules: Vec::new(),
        updates: 0,
        duplicate: None,
    };
    static_rules(&mut kit, plugin);
    let mut left_behind = Vec::new();
    match &options.settings {
        None => kit.skip(
            "init.ok",
            "no settings: give --settings, --config/--pool or --example-cloud",
        ),
        Some(settings) => {
            if let Some(info) = contract(&mut kit, provider, settings).await {
                if options.provision {
                    tokio::pin!(interrupted);
                    let mut created = BTreeSet::new();
                    let steps = provision(&mut kit, provider, &info, options, &mut created);
                    tokio::select! {
                        () = steps => {}
                        () = &mut interrupted => kit.fail("provision.interrupted", "interrupted (Ctrl-C): removing what was created"),
                    }
                    left_behind = cleanup(provider, created, options).await;
                } else {
                    kit.skip(
                        "provision",
                        "not asked: --provision creates a real instance and removes it",
                    );
                }
            }
        }
    }
    match (kit.duplicate.clone(), kit.updates) {
        (None, 0) => {}
        (None, n) => kit.pass(
            "update.unique",
            format!("{n} updates, each instance listed once"),
        ),
        (Some(id), _) => kit.fail(
            "update.unique",
            format!("{id} is listed twice in one update"),
        ),
    }
    let _ = provider.shutdown().await; // the verdict stands whatever shutdown says
    Report {
        plugin: label.to_string(),
        rules: kit.rules,
        left_behind,
    }
}

/// The rules its load already decided: the world it exports, its imports, its size.
fn static_rules(kit: &mut Kit, plugin: &LoadedPlugin) {
    kit.pass(
        "static.world",
        format!(
            "{} exporting {}",
            plugin.shape.world,
            plugin.shape.exports.join(", ")
        ),
    );
    kit.pass(
        "static.imports",
        format!(
            "{} imports, each one the host provides",
            plugin.shape.imports.len()
        ),
    );
    let compile = match plugin.cache {
        flotilla_plugin_runtime::CacheOutcome::Hit => "compiled code from the cache".to_string(),
        flotilla_plugin_runtime::CacheOutcome::Compiled { millis }
        | flotilla_plugin_runtime::CacheOutcome::Uncached { millis } => {
            format!("compiled in {millis} ms")
        }
    };
    kit.pass(
        "static.size",
        format!("{} KiB, {compile}", plugin.size.div_ceil(1024)),
    );
}

/// The error of a call, as a line.
fn said<T>(r: &Result<T, CallError>) -> String {
    match r {
        Ok(_) => "succeeded".to_string(),
        Err(e) => e.to_string(),
    }
}

fn provider_error<T>(r: &Result<T, CallError>) -> Option<&ProviderError> {
    r.as_ref().err().and_then(CallError::provider_error)
}

/// `settings` with `keys` added (each `true`); `None` when they are not a JSON object.
fn with_keys(settings: &str, keys: &[&str]) -> Option<String> {
    let mut value: serde_json::Value = serde_json::from_str(settings).ok()?;
    let map = value.as_object_mut()?;
    for k in keys {
        map.insert((*k).to_string(), serde_json::Value::Bool(true));
    }
    Some(value.to_string())
}

/// The harmless rules; the provider info when `init` works.
async fn contract(
    kit: &mut Kit,
    provider: &(impl Provider + ?Sized),
    settings: &str,
) -> Option<ProviderInfo> {
    let info = match provider.init(settings).await {
        Ok(info) => {
            kit.pass(
                "init.ok",
                format!("id={} max-size={}", info.id, info.max_size),
            );
            info
        }
        Err(e) => {
            kit.fail("init.ok", e.to_string());
            return None;
        }
    };
    unknown_keys(kit, provider, settings).await;
    // Back to the good settings before the other rules.
    if let Err(e) = provider.init(settings).await {
        kit.fail(
            "init.ok",
            format!("init with the same settings failed the second time: {e}"),
        );
        return None;
    }
    update_stable(kit, provider).await;
    let r = provider.connect_info(NO_SUCH_ID).await;
    kit.check(
        "connect-info.unknown",
        matches!(provider_error(&r), Some(ProviderError::NotFound(_))),
        "an unknown id is not-found",
        format!("expected not-found for {NO_SUCH_ID}, got: {}", said(&r)),
    );
    Some(info)
}

/// `init.unknown-key` and `init.all-problems`: one unknown key refused by name, then two,
/// both named in one error.
async fn unknown_keys(kit: &mut Kit, provider: &(impl Provider + ?Sized), settings: &str) {
    match with_keys(settings, &UNKNOWN_KEYS[..1]) {
        None => {
            kit.skip("init.unknown-key", "the settings are not a JSON object");
            kit.skip("init.all-problems", "the settings are not a JSON object");
        }
        Some(one) => {
            let r = provider.init(&one).await;
            let refused = matches!(provider_error(&r), Some(ProviderError::InvalidConfig(m)) if m.contains(UNKNOWN_KEYS[0]));
            kit.check(
                "init.unknown-key",
                refused,
                "an unknown key is refused as invalid-config, by name",
                format!(
                    "expected invalid-config naming {}, got: {}",
                    UNKNOWN_KEYS[0],
                    said(&r)
                ),
            );
            let both = with_keys(settings, &UNKNOWN_KEYS).unwrap_or_default();
            let r = provider.init(&both).await;
            match provider_error(&r) {
                _ if r.is_ok() => kit.skip(
                    "init.all-problems",
                    "init accepted unknown keys (see init.unknown-key)",
                ),
                Some(ProviderError::InvalidConfig(m)) => {
                    let missing: Vec<&str> = UNKNOWN_KEYS
                        .iter()
                        .copied()
                        .filter(|k| !m.contains(k))
                        .collect();
                    kit.check(
                        "init.all-problems",
                        missing.is_empty(),
                        "every problem is reported in one error",
                        format!(
                            "one error must name every problem; missing {}: {m}",
                            missing.join(", ")
                        ),
                    );
                }
                _ => kit.fail(
                    "init.all-problems",
                    format!("expected invalid-config, got: {}", said(&r)),
                ),
            }
        }
    }
}

/// `update.stable`: two updates in a row list the same ids.
async fn update_stable(kit: &mut Kit, provider: &(impl Provider + ?Sized)) {
    match (
        provider.update().await.map(|l| l.instances),
        provider.update().await.map(|l| l.instances),
    ) {
        (Ok(a), Ok(b)) => {
            kit.saw(&a);
            kit.saw(&b);
            let ids = |l: &[flotilla_provider::Instance]| {
                l.iter().map(|i| i.id.clone()).collect::<Vec<_>>()
            };
            let (a, b) = (ids(&a), ids(&b));
            let (sa, sb): (BTreeSet<_>, BTreeSet<_>) = (a.iter().collect(), b.iter().collect());
            kit.check(
                "update.stable",
                sa == sb,
                "two updates in a row list the same ids",
                format!("two updates in a row differ: {a:?} then {b:?}"),
            );
        }
        (Err(e), _) | (_, Err(e)) => kit.fail("update.stable", e.to_string()),
    }
}

/// Why waiting on `update` ended without the awaited list.
enum Waited {
    /// Not within the timeout (or the calls kept failing), with the last view.
    Timeout(String),
    /// An answer broke the contract; waiting on more answers cannot help.
    Violation(String),
}

/// Polls `update` until `done` accepts the list or `timeout` passes; the last list.
async fn wait_for(
    kit: &mut Kit,
    provider: &(impl Provider + ?Sized),
    options: &KitOptions,
    mut done: impl FnMut(&[flotilla_provider::Instance]) -> bool,
) -> Result<Vec<flotilla_provider::Instance>, Waited> {
    let start = Instant::now();
    loop {
        let answer = provider.update().await.map(|l| l.instances);
        match &answer {
            Ok(list) => kit.saw(list),
            Err(CallError::ContractViolation { detail, .. }) => {
                if detail.contains("listed twice") && kit.duplicate.is_none() {
                    kit.duplicate = Some(detail.clone());
                }
                return Err(Waited::Violation(detail.clone()));
            }
            Err(_) => {}
        }
        match answer {
            Ok(list) if done(&list) => return Ok(list),
            Ok(list) if start.elapsed() >= options.timeout => {
                return Err(Waited::Timeout(format!(
                    "not within {:?}; last update: {}",
                    options.timeout,
                    list.iter()
                        .map(|i| format!("{} {:?}", i.id, i.state))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            Ok(_) => {}
            Err(e) if start.elapsed() >= options.timeout => {
                return Err(Waited::Timeout(e.to_string()));
            }
            Err(_) => {}
        }
        tokio::time::sleep(options.poll).await;
    }
}

/// The rules that create an instance; every id seen to appear goes into `created`.
async fn provision(
    kit: &mut Kit,
    provider: &(impl Provider + ?Sized),
    info: &ProviderInfo,
    options: &KitOptions,
    created: &mut BTreeSet<String>,
) {
    let Some(id) = create_one(kit, provider, options, created).await else {
        return;
    };
    check_running(kit, provider, info, &id).await;
    check_decrease(kit, provider, &id).await;
    await_gone(kit, provider, options, created, &id).await;
}

/// `provision.increase` and `provision.appears`: one instance asked for, and its id once it
/// runs.
async fn create_one(
    kit: &mut Kit,
    provider: &(impl Provider + ?Sized),
    options: &KitOptions,
    created: &mut BTreeSet<String>,
) -> Option<String> {
    let before: BTreeSet<String> = match provider.update().await.map(|l| l.instances) {
        Ok(l) => l.into_iter().map(|i| i.id).collect(),
        Err(e) => {
            kit.fail("provision.increase", format!("update before: {e}"));
            return None;
        }
    };
    let granted = match provider.increase(1).await {
        Ok(n) => n,
        Err(e) => {
            kit.fail("provision.increase", e.to_string());
            return None;
        }
    };
    kit.check(
        "provision.increase",
        granted <= 1,
        format!("increase(1) granted {granted}"),
        format!("increase(1) granted {granted}: never more than asked"),
    );
    if granted == 0 {
        kit.skip(
            "provision.appears",
            "increase(1) granted nothing (is the group full?)",
        );
        return None;
    }
    let mut new_id = None;
    let appeared = wait_for(kit, provider, options, |list| {
        for i in list {
            if !before.contains(&i.id) {
                created.insert(i.id.clone());
            }
        }
        new_id = list
            .iter()
            .find(|i| !before.contains(&i.id) && i.state == InstanceState::Running)
            .map(|i| i.id.clone());
        new_id.is_some()
    })
    .await;
    match (appeared, new_id) {
        (Ok(_), Some(id)) => {
            kit.pass("provision.appears", format!("{id} is running"));
            Some(id)
        }
        (Err(Waited::Violation(detail)), _) => {
            kit.skip(
                "provision.appears",
                format!("update answers break the contract ({detail}); see update.unique"),
            );
            None
        }
        (Err(Waited::Timeout(e)), _) => {
            kit.fail("provision.appears", format!("no new running instance: {e}"));
            None
        }
        (Ok(_), None) => {
            kit.fail("provision.appears", "no new running instance");
            None
        }
    }
}

/// `provision.connect-info` and `provision.heartbeat` on the running instance `id`.
async fn check_running(
    kit: &mut Kit,
    provider: &(impl Provider + ?Sized),
    info: &ProviderInfo,
    id: &str,
) {
    match provider.connect_info(id).await {
        Ok(c) if c.internal_address.is_some() || c.external_address.is_some() => kit.pass(
            "provision.connect-info",
            format!(
                "{} {}:{}{}",
                c.username,
                c.internal_address
                    .as_deref()
                    .or(c.external_address.as_deref())
                    .unwrap_or_default(),
                c.port,
                c.zone
                    .as_deref()
                    .map(|zone| format!(" in zone {zone}"))
                    .unwrap_or_default()
            ),
        ),
        Ok(_) => kit.fail("provision.connect-info", "no address"),
        Err(e) => kit.fail("provision.connect-info", e.to_string()),
    }
    if info.heartbeat {
        let r = provider.heartbeat(id).await;
        kit.check(
            "provision.heartbeat",
            r.is_ok(),
            "a running instance answers",
            said(&r),
        );
    } else {
        kit.skip("provision.heartbeat", "not advertised");
    }
}

/// `decrease.subset` and `decrease.idempotent`: `id` and an unknown id asked twice.
async fn check_decrease(kit: &mut Kit, provider: &(impl Provider + ?Sized), id: &str) {
    let asked = vec![id.to_string(), NO_SUCH_ID.to_string()];
    let first = provider.decrease(&asked).await;
    let second = provider.decrease(&asked).await;
    let outside = |r: &Result<Vec<String>, CallError>| {
        r.as_ref()
            .map(|l| {
                l.iter()
                    .filter(|i| !asked.contains(i))
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    match &first {
        Err(e) => kit.fail("decrease.subset", e.to_string()),
        Ok(accepted) => {
            let extra: Vec<String> = outside(&first)
                .into_iter()
                .chain(outside(&second))
                .collect();
            if !extra.is_empty() {
                kit.fail(
                    "decrease.subset",
                    format!("returned ids it was not asked for: {}", extra.join(", ")),
                );
            } else if !accepted.iter().any(|a| a == id) {
                kit.fail(
                    "decrease.subset",
                    format!("did not accept {id}, the instance it created"),
                );
            } else {
                kit.pass(
                    "decrease.subset",
                    format!("accepted {}", accepted.join(", ")),
                );
            }
        }
    }
    match &second {
        Err(CallError::ContractViolation { .. }) => kit.skip(
            "decrease.idempotent",
            "the answer itself broke the contract (see decrease.subset)",
        ),
        Ok(again) if again.iter().any(|a| a == id) => kit.pass(
            "decrease.idempotent",
            "asking again succeeds and accepts the instance again",
        ),
        Ok(again) => kit.fail(
            "decrease.idempotent",
            format!("asked again, it no longer accepts {id} (answered {again:?}); an instance being deleted or gone counts as accepted"),
        ),
        Err(e) => kit.fail("decrease.idempotent", format!("asked again: {e}")),
    }
}

/// `provision.gone`: the decreased instance leaves the listing.
async fn await_gone(
    kit: &mut Kit,
    provider: &(impl Provider + ?Sized),
    options: &KitOptions,
    created: &mut BTreeSet<String>,
    id: &str,
) {
    let gone = wait_for(kit, provider, options, |list| {
        !list
            .iter()
            .any(|i| i.id == id && i.state != InstanceState::Deleted)
    })
    .await;
    match gone {
        Ok(_) => {
            created.remove(id);
            kit.pass("provision.gone", format!("{id} is gone"));
        }
        Err(Waited::Timeout(e) | Waited::Violation(e)) => {
            kit.fail("provision.gone", format!("{id} did not go: {e}"))
        }
    }
}

/// Removes every created instance not yet seen gone; those still there at the end.
async fn cleanup(
    provider: &(impl Provider + ?Sized),
    created: BTreeSet<String>,
    options: &KitOptions,
) -> Vec<String> {
    if created.is_empty() {
        return Vec::new();
    }
    let ids: Vec<String> = created.into_iter().collect();
    let _ = provider.decrease(&ids).await; // what remains is reported below
    let mut scratch = Kit {
        rules: Vec::new(),
        updates: 0,
        duplicate: None,
    };
    match wait_for(&mut scratch, provider, options, |list| {
        !list
            .iter()
            .any(|i| ids.contains(&i.id) && i.state != InstanceState::Deleted)
    })
    .await
    {
        Ok(_) => Vec::new(),
        Err(_) => ids,
    }
}
