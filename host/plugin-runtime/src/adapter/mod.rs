//! [`WasmProvider`]: the `Provider` trait over the generated bindings, with deadlines, fault
//! containment (a faulty instance is discarded and re-initialised), contract checks and a
//! circuit breaker.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use wasmtime::Store;

use super::bindings::flotilla::provider::types as wit;

mod answers;
mod deadline;

use super::contract;
use super::egress::{Budget, EgressShared, EgressStats};
use super::output::{GuestOutput, Origin, guest_text};
use super::{HostState, Sandbox};
use answers::{
    IdSet, MAX_ID, MAX_LISTED, convert_connection, convert_error, convert_info, convert_state,
};
use deadline::{arm_deadline, describe_trap, with_guest_words, within, yield_or_interrupt};
use flotilla_provider::{
    Arch, CallError, Connection, Function, Instance, InstanceState, Listing, MemoryState, Os,
    PluginState, Protocol, Provider, ProviderError, ProviderHealth, ProviderInfo,
};

/// One running plugin instance (not a lease slot), boxed: it moves into and out of every
/// call's future, and a pointer moves cheaper than the store, bindings and outputs.
type Running = Box<Live>;

/// The parts of one live plugin instance.
struct Live {
    store: Store<HostState>,
    bindings: contract::Exports,
    stdout: GuestOutput,
    stderr: GuestOutput,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.stdout.flush_line();
        self.stderr.flush_line();
    }
}

struct Inner {
    instance: Option<Running>,
    settings: Option<String>,
}

#[derive(Default)]
struct HealthState {
    health: ProviderHealth,
    open_until: Option<Instant>,
    /// The outcomes of the most recent calls (`true`: a fault), oldest first. The circuit
    /// opens on `circuit_threshold` faults among them, so a plugin that alternates success and
    /// fault cannot keep itself from tripping it.
    recent: std::collections::VecDeque<bool>,
}

impl HealthState {
    /// Records one call's outcome in the window of the last `2 × threshold` calls (at least
    /// 4); the faults now in it.
    fn remember(&mut self, fault: bool, threshold: u32) -> usize {
        let window = (2 * threshold as usize).max(4);
        self.recent.push_back(fault);
        while self.recent.len() > window {
            self.recent.pop_front();
        }
        self.recent.iter().filter(|f| **f).count()
    }
}

/// What an export call's future ends with: the instance back, and the call's outcome.
type CallOutput<T> = (Running, wasmtime::Result<Result<T, wit::Error>>);

/// A pool's plugin as a [`Provider`]: calls are serialised, bounded and contained.
pub struct WasmProvider {
    pre: contract::ProviderPre,
    origin: Origin,
    sandbox: Sandbox,
    egress: EgressShared,
    inner: tokio::sync::Mutex<Inner>,
    health: Mutex<HealthState>,
    /// No fault among the recent calls, none in a row, and the circuit closed: a success then
    /// changes nothing, and neither the check nor the record needs the health lock.
    calm: AtomicBool,
    /// The pool's `state` (the host's store, or memory): shared by every instance, so it
    /// outlives a trapped one.
    state: Arc<dyn PluginState>,
    /// Set by [`Provider::close`]: running calls end, and only `decrease` and `shutdown` run.
    closing: tokio::sync::watch::Sender<bool>,
    /// Microseconds calls have waited for the one instance (calls are serialised).
    waited_micros: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for WasmProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmProvider")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// How a call ended, before it is turned into a `CallError`.
enum Fault {
    Trap(String),
    Timeout(Duration),
    /// The pool closed while the call ran: not the plugin's fault.
    Abandoned,
}

impl WasmProvider {
    pub(crate) fn new(pre: contract::ProviderPre, origin: Origin, sandbox: Sandbox) -> Self {
        let stored = sandbox
            .state
            .clone()
            .unwrap_or_else(|| Arc::new(MemoryState::default()));
        let state: Arc<dyn PluginState> = Arc::new(flotilla_provider::Budgeted::new(
            stored,
            flotilla_provider::StateLimits::default().write_bytes_per_minute,
        ));
        WasmProvider {
            state,
            pre,
            origin,
            egress: EgressShared {
                policy: Arc::new(sandbox.egress.clone()),
                budget: Arc::new(Budget::new(
                    sandbox.limits.requests_in_flight,
                    sandbox.limits.requests_per_minute,
                )),
                ..EgressShared::default()
            },
            sandbox,
            inner: tokio::sync::Mutex::new(Inner {
                instance: None,
                settings: None,
            }),
            health: Mutex::new(HealthState::default()),
            calm: AtomicBool::new(true),
            closing: tokio::sync::watch::Sender::new(false),
            waited_micros: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Creates and discards one fresh instance: a cheap probe that the plugin still links and
    /// starts, and the unit that instantiation benchmarks measure.
    pub async fn probe_instantiate(&self) -> Result<(), CallError> {
        self.instantiate().await.map(drop)
    }

    /// Outgoing requests of this pool's plugin that hold a budget slot now.
    pub fn requests_in_flight(&self) -> u32 {
        self.egress.budget.in_flight()
    }

    /// Outbound request counters of this pool's plugin.
    pub fn egress_stats(&self) -> Arc<EgressStats> {
        self.egress.stats.clone()
    }

    async fn instantiate(&self) -> Result<Running, CallError> {
        let budget = self.sandbox.limits.output_bytes;
        let stdout = GuestOutput::new(self.origin.clone(), "stdout", budget);
        let stderr = GuestOutput::new(self.origin.clone(), "stderr", budget);
        let state = HostState::new(
            self.origin.clone(),
            &self.sandbox.limits,
            self.sandbox.ssh_public_key.clone(),
            self.state.clone(),
            &self.egress,
            stdout.clone(),
            stderr.clone(),
        );
        #[cfg(feature = "test-probe")]
        let state = HostState {
            probe: self.sandbox.probe.clone(),
            ..state
        };
        let mut store = Store::new(self.pre.engine(), state);
        store.limiter(|s| &mut s.limiter);
        store.epoch_deadline_callback(yield_or_interrupt);
        let deadline = self.sandbox.limits.deadline(Function::Init);
        arm_deadline(&mut store, deadline);
        // Epochs stop wasm code, not a start-up that waits on a host pollable: the whole
        // instantiation is bounded too, and a wedged store is dropped, not awaited.
        let instantiated =
            tokio::time::timeout(deadline, self.pre.instantiate_async(&mut store)).await;
        let Ok(instantiated) = instantiated else {
            return Err(self.fault(Function::Init, Fault::Timeout(deadline)));
        };
        match instantiated {
            Ok(bindings) => Ok(Box::new(Live {
                store,
                bindings,
                stdout,
                stderr,
            })),
            Err(e) => {
                let message = with_guest_words(describe_trap(&store, &e), &stderr, &stdout);
                Err(self.fault(Function::Init, Fault::Trap(message)))
            }
        }
    }

    /// Runs one export call on `instance` under the function's deadline. The instance is returned
    /// only if the call completed without a trap.
    async fn call_in<T: Send + 'static, F: Future<Output = CallOutput<T>> + Send>(
        &self,
        function: Function,
        mut instance: Running,
        call: impl FnOnce(Running) -> F,
    ) -> (Option<Running>, Result<Result<T, wit::Error>, Fault>) {
        let deadline = self.sandbox.limits.deadline(function);
        arm_deadline(&mut instance.store, deadline);
        instance.store.data_mut().log_lines_left = self.sandbox.limits.log_lines_per_call;
        instance.store.data_mut().log_dropped = 0;
        instance.store.data_mut().state_writes_left =
            flotilla_provider::StateLimits::default().writes_per_call;
        instance.store.data_mut().hooks.requests_this_call = 0;
        instance.store.data_mut().reported_max = None;
        // A close ends the calls running when it comes, not the ones it leaves to run.
        let mut closing = self.closing.subscribe();
        closing.mark_unchanged();
        let ran = tokio::select! {
            ran = within(deadline, call(instance)) => ran,
            _ = closing.changed() => return (None, Err(Fault::Abandoned)),
        };
        match ran {
            None => (None, Err(Fault::Timeout(deadline))),
            Some((mut instance, Ok(result))) => {
                // No request outlives its call (a dropped store takes its requests along).
                instance.store.data_mut().hooks.scope.end();
                (Some(instance), Ok(result))
            }
            Some((instance, Err(e))) => {
                let fault = match e.downcast_ref::<wasmtime::Trap>() {
                    Some(wasmtime::Trap::Interrupt) => Fault::Timeout(deadline),
                    _ => Fault::Trap(with_guest_words(
                        describe_trap(&instance.store, &e),
                        &instance.stderr,
                        &instance.stdout,
                    )),
                };
                (None, Err(fault))
            }
        }
    }

    /// Gets the live instance, or a fresh one re-initialised with the pool's settings.
    async fn current_instance(
        &self,
        inner: &mut Inner,
        function: Function,
    ) -> Result<Running, CallError> {
        match inner.instance.take() {
            Some(instance) => Ok(instance),
            // Boxed: the rare path's large future stays out of every call's future, which is
            // moved on each call.
            None => Box::pin(self.fresh_instance(inner, function)).await,
        }
    }

    /// A fresh instance re-initialised with the pool's settings.
    async fn fresh_instance(
        &self,
        inner: &mut Inner,
        function: Function,
    ) -> Result<Running, CallError> {
        let Some(settings) = inner.settings.clone() else {
            return Err(CallError::NotInitialized { function });
        };
        self.record_restart();
        let instance = self.instantiate().await?;
        let (instance, outcome) = self
            .call_in(Function::Init, instance, move |s| init_call(s, settings))
            .await;
        match outcome {
            Ok(Ok(_info)) => instance.ok_or_else(|| CallError::Host {
                function,
                message: "lost instance".into(),
            }),
            Ok(Err(e)) => Err(CallError::Provider {
                function: Function::Init,
                error: convert_error(e),
            }),
            Err(fault) => Err(self.fault(Function::Init, fault)),
        }
    }

    /// The error of a call the closing pool did not run, or ended.
    fn closed(function: Function) -> CallError {
        CallError::Host {
            function,
            message: "the pool is closing: its shutdown grace is over".into(),
        }
    }

    /// The one instance's lock, its wait counted for the plugin's health.
    async fn serialised(&self) -> tokio::sync::MutexGuard<'_, Inner> {
        let start = Instant::now();
        let inner = self.inner.lock().await;
        let waited = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.waited_micros
            .fetch_add(waited, std::sync::atomic::Ordering::Relaxed);
        inner
    }

    /// Runs `call` with containment: circuit check, live instance, deadline, fault accounting.
    async fn run<T: Send + 'static, F: Future<Output = CallOutput<T>> + Send>(
        &self,
        function: Function,
        call: impl FnOnce(Running) -> F,
    ) -> Result<T, CallError> {
        if *self.closing.borrow() && !matches!(function, Function::Decrease | Function::Shutdown) {
            return Err(Self::closed(function));
        }
        self.check_circuit(function)?;
        let mut inner = self.serialised().await;
        let instance = self.current_instance(&mut inner, function).await?;
        let (instance, outcome) = self.call_in(function, instance, call).await;
        inner.instance = instance;
        match outcome {
            Ok(Ok(value)) => {
                self.record_success();
                Ok(value)
            }
            Ok(Err(e)) => {
                self.record_success();
                Err(CallError::Provider {
                    function,
                    error: convert_error(e),
                })
            }
            Err(fault) => Err(self.fault(function, fault)),
        }
    }

    fn check_circuit(&self, function: Function) -> Result<(), CallError> {
        if self.calm.load(Ordering::Acquire) {
            return Ok(());
        }
        let h = self.health.lock();
        match h.open_until {
            Some(until) if Instant::now() < until => Err(CallError::CircuitOpen {
                function,
                faults: h.health.consecutive_faults,
                last: h.health.last_fault.clone().unwrap_or_default(),
                retry_in: until.saturating_duration_since(Instant::now()),
            }),
            _ => Ok(()),
        }
    }

    fn record_success(&self) {
        if self.calm.load(Ordering::Acquire) {
            return;
        }
        let mut h = self.health.lock();
        let faults_in_window = h.remember(false, self.sandbox.limits.circuit_threshold);
        h.health.consecutive_faults = 0;
        h.health.circuit_open = false;
        h.open_until = None;
        if faults_in_window == 0 {
            self.calm.store(true, Ordering::Release);
        }
    }

    fn record_restart(&self) {
        self.health.lock().health.restarts += 1;
    }

    fn fault(&self, function: Function, fault: Fault) -> CallError {
        let error = match fault {
            Fault::Trap(message) => CallError::Trap { function, message },
            Fault::Timeout(after) => CallError::Timeout { function, after },
            Fault::Abandoned => return Self::closed(function),
        };
        self.note_fault(&error);
        error
    }

    fn note_fault(&self, error: &CallError) {
        let mut h = self.health.lock();
        self.calm.store(false, Ordering::Release);
        match error {
            CallError::Trap { .. } => h.health.traps += 1,
            CallError::Timeout { .. } => h.health.timeouts += 1,
            CallError::ContractViolation { .. } => h.health.contract_violations += 1,
            _ => {}
        }
        h.health.consecutive_faults += 1;
        h.health.last_fault = Some(error.to_string());
        let threshold = self.sandbox.limits.circuit_threshold;
        let faults_in_window = h.remember(true, threshold);
        if faults_in_window >= threshold as usize {
            // Opened: the window starts afresh once the cooldown lets calls through again.
            h.recent.clear();
            h.health.circuit_open = true;
            h.open_until = Some(Instant::now() + self.sandbox.limits.circuit_cooldown);
        }
        tracing::warn!(
            target: "flotilla::plugin",
            pool = %self.origin.pool,
            plugin = %self.origin.plugin,
            consecutive_faults = h.health.consecutive_faults,
            circuit_open = h.health.circuit_open,
            "plugin fault: {error}"
        );
    }

    fn violation(&self, function: Function, detail: String) -> CallError {
        let error = CallError::ContractViolation { function, detail };
        self.note_fault(&error);
        error
    }
}

async fn init_call(mut s: Running, settings: String) -> CallOutput<wit::ProviderInfo> {
    let r = s.bindings.init(&mut s.store, &settings).await;
    (s, r)
}

#[async_trait]
impl Provider for WasmProvider {
    async fn init(&self, settings: &str) -> Result<ProviderInfo, CallError> {
        let function = Function::Init;
        self.check_circuit(function)?;
        let mut inner = self.serialised().await;
        // A fresh instance every time: init is the one call that may change the settings.
        inner.instance = None;
        let instance = self.instantiate().await?;
        let settings = settings.to_string();
        let for_call = settings.clone();
        let (instance, outcome) = self
            .call_in(function, instance, move |s| init_call(s, for_call))
            .await;
        match outcome {
            Ok(Ok(info)) => {
                self.record_success();
                inner.instance = instance;
                inner.settings = Some(settings);
                Ok(convert_info(info))
            }
            Ok(Err(e)) => {
                self.record_success();
                inner.settings = None;
                Err(CallError::Provider {
                    function,
                    error: convert_error(e),
                })
            }
            Err(fault) => {
                inner.settings = None;
                Err(self.fault(function, fault))
            }
        }
    }

    async fn update(&self) -> Result<Listing, CallError> {
        let (list, group_max) = self
            .run(Function::Update, |mut s| async move {
                let r = s.bindings.update(&mut s.store).await;
                let reported = s.store.data_mut().reported_max.take();
                (s, r.map(|r| r.map(|list| (list, reported))))
            })
            .await?;
        if list.len() > MAX_LISTED {
            return Err(self.violation(
                Function::Update,
                format!(
                    "update listed {} instances; at most {MAX_LISTED} are accepted",
                    list.len()
                ),
            ));
        }
        let mut seen = IdSet::with_capacity(list.len());
        for i in &list {
            if i.id.len() > MAX_ID {
                return Err(self.violation(
                    Function::Update,
                    format!("an instance id is {} bytes; at most {MAX_ID}", i.id.len()),
                ));
            }
            if i.id.is_empty() {
                return Err(
                    self.violation(Function::Update, "an instance has an empty id".to_string())
                );
            }
            if !seen.insert(i.id.as_str()) {
                return Err(self.violation(
                    Function::Update,
                    format!("instance id {:?} is listed twice", i.id),
                ));
            }
        }
        Ok(Listing {
            instances: list
                .into_iter()
                .map(|i| Instance {
                    id: i.id,
                    state: convert_state(i.state),
                })
                .collect(),
            group_max,
        })
    }

    async fn increase(&self, delta: u32) -> Result<u32, CallError> {
        let granted = self
            .run(Function::Increase, move |mut s| async move {
                let r = s.bindings.increase(&mut s.store, delta).await;
                (s, r)
            })
            .await?;
        if granted > delta {
            return Err(self.violation(
                Function::Increase,
                format!("asked for {delta} instances, plugin claims {granted}"),
            ));
        }
        Ok(granted)
    }

    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, CallError> {
        let asked = ids.to_vec();
        let accepted = self
            .run(Function::Decrease, move |mut s| async move {
                let r = s.bindings.decrease(&mut s.store, &asked).await;
                (s, r)
            })
            .await?;
        let asked: HashSet<&str> = ids.iter().map(String::as_str).collect();
        let mut seen = IdSet::with_capacity(accepted.len());
        for id in &accepted {
            if !asked.contains(id.as_str()) {
                return Err(self.violation(
                    Function::Decrease,
                    format!("accepted id {id:?}, which was not asked for"),
                ));
            }
            if !seen.insert(id.as_str()) {
                return Err(self.violation(Function::Decrease, format!("accepted id {id:?} twice")));
            }
        }
        Ok(accepted)
    }

    async fn connect_info(&self, id: &str) -> Result<Connection, CallError> {
        let asked = id.to_string();
        let info = self
            .run(Function::ConnectInfo, move |mut s| async move {
                let r = s.bindings.connect_info(&mut s.store, &asked).await;
                (s, r)
            })
            .await?;
        if info.id != id {
            return Err(self.violation(
                Function::ConnectInfo,
                format!("asked about {id:?}, answered about {:?}", info.id),
            ));
        }
        Ok(convert_connection(info))
    }

    async fn heartbeat(&self, id: &str) -> Result<(), CallError> {
        let asked = id.to_string();
        self.run(Function::Heartbeat, move |mut s| async move {
            let r = s.bindings.heartbeat(&mut s.store, &asked).await;
            (s, r)
        })
        .await
    }

    async fn shutdown(&self) -> Result<(), CallError> {
        self.run(Function::Shutdown, |mut s| async move {
            let r = s.bindings.shutdown(&mut s.store).await;
            (s, r)
        })
        .await
    }

    fn close(&self) {
        self.closing.send_replace(true);
    }

    fn health(&self) -> ProviderHealth {
        let mut h = self.health.lock();
        if h.open_until.is_some_and(|until| Instant::now() >= until) {
            h.health.circuit_open = false;
        }
        ProviderHealth {
            egress_denied: self
                .egress
                .stats
                .denied
                .load(std::sync::atomic::Ordering::Relaxed),
            egress_remints: self
                .egress
                .stats
                .remints
                .load(std::sync::atomic::Ordering::Relaxed),
            call_wait_micros: self
                .waited_micros
                .load(std::sync::atomic::Ordering::Relaxed),
            ..h.health.clone()
        }
    }
}
