//! `flotilla gitlab terminal`: an operator's shell in a running job, its own terminal in raw
//! mode for the session.

use super::*;

/// `terminal`: the shell's exit code is this process's. `on_machine` is the instance-mode
/// command line for the job's machine; without it the shell opens in the job's container.
pub(super) async fn terminal(
    api: &flotilla_gitlab::ApiClient,
    job: &str,
    who: Option<&str>,
    command: &[String],
    on_machine: Option<String>,
) -> anyhow::Result<()> {
    use flotilla_gitlab::terminal::{DEFAULT_SHELL, TerminalSide, open, open_on_machine};
    use std::io::IsTerminal;

    let who = who
        .map(str::to_string)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_default();
    let command: Vec<String> = if command.is_empty() {
        DEFAULT_SHELL.iter().map(|s| s.to_string()).collect()
    } else {
        command.to_vec()
    };
    let tty = std::io::stdin().is_terminal();
    let raw = if tty { raw::Raw::enter() } else { None };
    let side = TerminalSide {
        tty,
        size: raw.as_ref().and_then(raw::Raw::size),
    };
    let ended = match on_machine {
        Some(line) => {
            open_on_machine(api, job, line, &who, side, stdin(), tokio::io::stdout()).await
        }
        None => open(api, job, &command, &who, side, stdin(), tokio::io::stdout()).await,
    };
    drop(raw);
    match ended {
        Ok(0) => Ok(()),
        Ok(code) => Err(ExitWith(u8::try_from(code.clamp(1, 255)).unwrap_or(1)).into()),
        Err(e) => Err(anyhow::anyhow!("terminal: {e}")),
    }
}

/// Standard input, read on a thread of its own: tokio's stdin reads on the blocking pool,
/// whose pending read would hold the process open after the session ends.
fn stdin() -> tokio::io::DuplexStream {
    use std::io::Read;
    use tokio::io::AsyncWriteExt;
    let (reader, mut writer) = tokio::io::duplex(64 * 1024);
    let handle = tokio::runtime::Handle::current();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = stdin.read(&mut buf) {
            let typed = buf.get(..n).unwrap_or_default();
            if handle.block_on(writer.write_all(typed)).is_err() {
                break;
            }
        }
    });
    reader
}

/// The operator's terminal in raw mode while the session runs (keys go through as typed,
/// Ctrl-C included), restored after. Unix only; elsewhere the terminal stays as it is.
mod raw {
    #[cfg(unix)]
    pub struct Raw(rustix::termios::Termios);

    #[cfg(not(unix))]
    pub struct Raw;

    #[cfg(unix)]
    impl Raw {
        pub fn enter() -> Option<Raw> {
            use rustix::termios::{OptionalActions, tcgetattr, tcsetattr};
            let stdin = std::io::stdin();
            let saved = tcgetattr(&stdin).ok()?;
            let mut raw = saved.clone();
            raw.make_raw();
            tcsetattr(&stdin, OptionalActions::Now, &raw).ok()?;
            Some(Raw(saved))
        }

        /// (rows, columns).
        pub fn size(&self) -> Option<(u16, u16)> {
            let size = rustix::termios::tcgetwinsize(std::io::stdout()).ok()?;
            (size.ws_row > 0 && size.ws_col > 0).then_some((size.ws_row, size.ws_col))
        }
    }

    #[cfg(unix)]
    impl Drop for Raw {
        fn drop(&mut self) {
            use rustix::termios::{OptionalActions, tcsetattr};
            let _ = tcsetattr(std::io::stdin(), OptionalActions::Now, &self.0);
        }
    }

    #[cfg(not(unix))]
    impl Raw {
        pub fn enter() -> Option<Raw> {
            None
        }

        pub fn size(&self) -> Option<(u16, u16)> {
            None
        }
    }
}
