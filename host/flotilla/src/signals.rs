//! What stops and what reloads the process, per platform.
//!
//! - Unix: SIGTERM and SIGINT (Ctrl-C) stop; SIGHUP reloads.
//! - Windows: Ctrl-C, Ctrl-Break, closing the console and system shutdown stop (a service
//!   manager sends one of these); there is no SIGHUP, so a reload comes only from the config
//!   file changing, which `flotilla run` watches on every platform.

/// The stop signals, registered once.
pub struct Stop {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(windows)]
    ctrl_break: tokio::signal::windows::CtrlBreak,
    #[cfg(windows)]
    ctrl_close: tokio::signal::windows::CtrlClose,
    #[cfg(windows)]
    ctrl_shutdown: tokio::signal::windows::CtrlShutdown,
}

impl Stop {
    /// Registers the handlers (before anything that must be stoppable starts).
    pub fn new() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Stop {
                term: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(windows)]
        {
            use tokio::signal::windows::{ctrl_break, ctrl_close, ctrl_shutdown};
            Ok(Stop {
                ctrl_break: ctrl_break()?,
                ctrl_close: ctrl_close()?,
                ctrl_shutdown: ctrl_shutdown()?,
            })
        }
    }

    /// Resolves when the process is asked to stop.
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        #[cfg(windows)]
        tokio::select! {
            _ = self.ctrl_break.recv() => {}
            _ = self.ctrl_close.recv() => {}
            _ = self.ctrl_shutdown.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
}

/// The reload signal: SIGHUP on Unix; none on Windows.
pub struct Reload {
    #[cfg(unix)]
    hup: tokio::signal::unix::Signal,
}

impl Reload {
    /// Registers the handler.
    pub fn new() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Reload {
                hup: signal(SignalKind::hangup())?,
            })
        }
        #[cfg(windows)]
        Ok(Reload {})
    }

    /// Resolves when the process is asked to reload; never on Windows.
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        {
            self.hup.recv().await;
        }
        #[cfg(windows)]
        std::future::pending::<()>().await;
    }
}
