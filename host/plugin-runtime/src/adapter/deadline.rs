//! A call's deadline: the epoch deadline armed in the store, the tokio timeout around it, the
//! guest's yields to the executor, and what a trap says.

use super::*;

/// Epoch ticks of guest code between two yields to the executor: a guest that computes
/// without waiting gives its worker thread back this often, so it cannot starve the API, the
/// metrics or other pools however long its deadline.
pub(super) const YIELD_EVERY_TICKS: u64 = 1;

/// Starts a call's (or an instantiation's) deadline.
pub(super) fn arm_deadline(store: &mut Store<HostState>, deadline: Duration) {
    store.data_mut().deadline = crate::Deadline::after(deadline);
    store.set_epoch_deadline(YIELD_EVERY_TICKS);
}

/// Runs `call` for at most `deadline`: `None` if it is not done by then (it is dropped, not
/// awaited). The clock and the timer are only needed if the call has to wait: a call that
/// completes on its first poll, as most calls that make no request do, reads no clock and sets
/// no timer. The epoch deadline bounds the guest's own running time either way.
pub(super) async fn within<F: Future>(deadline: Duration, call: F) -> Option<F::Output> {
    // Pinned in this future (itself in the boxed export future): no allocation of its own.
    let mut call = std::pin::pin!(call);
    let first = std::future::poll_fn(|cx| match call.as_mut().poll(cx) {
        std::task::Poll::Ready(out) => std::task::Poll::Ready(Some(out)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await;
    match first {
        Some(out) => Some(out),
        None => tokio::time::timeout(deadline, call).await.ok(),
    }
}

/// At every epoch check of a running guest: interrupt it past its deadline, otherwise yield to
/// the executor and let it run on. The tokio timeout around every call enforces the same
/// deadline while the guest waits on the host.
pub(super) fn yield_or_interrupt(
    mut store: wasmtime::StoreContextMut<'_, HostState>,
) -> wasmtime::Result<wasmtime::UpdateDeadline> {
    if Instant::now() >= store.data_mut().deadline.due() {
        return Ok(wasmtime::UpdateDeadline::Interrupt);
    }
    Ok(wasmtime::UpdateDeadline::YieldCustom(
        YIELD_EVERY_TICKS,
        Box::pin(tokio::task::yield_now()),
    ))
}

/// A trap message that says what happened in plain words (memory cap, interrupt, panic).
/// A trap's `message` with the guest's own last words above it: the last lines of its
/// stderr (else stdout), where a Rust panic, a Python traceback or a JavaScript error and stack
/// end up. They are guest text: escaped and capped like every guest string.
pub(super) fn with_guest_words(
    message: String,
    stderr: &GuestOutput,
    stdout: &GuestOutput,
) -> String {
    let (stream, lines) = match stderr.tail() {
        lines if lines.is_empty() => ("stdout", stdout.tail()),
        lines => ("stderr", lines),
    };
    if lines.is_empty() {
        return message;
    }
    let mut out = format!("guest {stream} (last {} lines):\n", lines.len());
    for line in &lines {
        out.push_str("  | ");
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&message);
    out
}

pub(super) fn describe_trap(store: &Store<HostState>, e: &wasmtime::Error) -> String {
    if let Some(after) = store.data().limiter.exceeded {
        return format!("memory cap exceeded (tried to grow to {} MiB)", after >> 20);
    }
    let root = match e.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => trap.to_string(),
        None => format!("{e}"),
    };
    let mut chain = format!("{e:#}");
    if chain.len() > 2048 {
        chain.truncate(
            chain
                .char_indices()
                .take_while(|(i, _)| *i < 2048)
                .last()
                .map_or(0, |(i, _)| i),
        );
    }
    if chain.contains(&root) {
        chain
    } else {
        format!("{root}: {chain}")
    }
}
