//! The runner's log line format (`log/runner_formatter.go` `RunnerTextFormatter`, installed by
//! `log.SetRunnerFormatter` in every helper command): level colour, a `WARNING: ` / `ERROR: `
//! / `FATAL: ` prefix, the message padded to 50 columns minus the prefix, the reset
//! sequence, then ` key=value` fields sorted by key. Lines go to stderr (`log/configuration.go`
//! `ConfigureLogging` sets the logger's output to `os.Stderr`).
//!
//! Owns: levels, the line format, and the `--debug` / `--log-level` threshold.
//! Must not know: what is being logged.

#[cfg(test)]
use std::cell::RefCell;
use std::io::Write;
#[cfg(test)]
use std::rc::Rc;

/// `helpers/ansi_colors.go`.
const ANSI_BOLD_RED: &str = "\x1b[31;1m";
const ANSI_BOLD_WHITE: &str = "\x1b[37;1m";
const ANSI_YELLOW: &str = "\x1b[0;33m";
const ANSI_RESET: &str = "\x1b[0;m";

/// logrus levels, least severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
    Fatal,
}

impl Level {
    /// `logrus.ParseLevel` (panic is accepted and treated as fatal: nothing here logs at it).
    pub fn parse(text: &str) -> Result<Level, String> {
        match text.to_lowercase().as_str() {
            "debug" | "trace" => Ok(Level::Debug),
            "info" => Ok(Level::Info),
            "warn" | "warning" => Ok(Level::Warn),
            "error" => Ok(Level::Error),
            "fatal" | "panic" => Ok(Level::Fatal),
            _ => Err(format!("not a valid logrus Level: {text:?}")),
        }
    }

    /// Colour and prefix (`getColorsAndPrefix`): Info has neither.
    fn style(self) -> (&'static str, &'static str) {
        match self {
            Level::Debug => (ANSI_BOLD_WHITE, ""),
            Level::Info => ("", ""),
            Level::Warn => (ANSI_YELLOW, "WARNING: "),
            Level::Error => (ANSI_BOLD_RED, "ERROR: "),
            Level::Fatal => (ANSI_BOLD_RED, "FATAL: "),
        }
    }
}

/// A log sink with a threshold.
pub struct Log {
    out: Box<dyn Write>,
    threshold: Level,
}

/// The bytes a capturing log wrote (tests).
#[cfg(test)]
#[derive(Clone, Default)]
pub struct Captured(Rc<RefCell<Vec<u8>>>);

#[cfg(test)]
impl Captured {
    /// Everything written so far, ANSI sequences removed.
    pub fn text(&self) -> String {
        let raw = String::from_utf8_lossy(&self.0.borrow()).to_string();
        strip_ansi(&raw)
    }
}

#[cfg(test)]
impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Removes `ESC [ ... m` sequences.
#[cfg(test)]
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Log {
    /// Logs to stderr at Info and above (the runner's default level).
    pub fn stderr() -> Log {
        Log {
            out: Box::new(std::io::stderr()),
            threshold: Level::Info,
        }
    }

    /// A log whose lines can be read back (tests).
    #[cfg(test)]
    pub fn capture() -> (Log, Captured) {
        let captured = Captured::default();
        let log = Log {
            out: Box::new(captured.clone()),
            threshold: Level::Debug,
        };
        (log, captured)
    }

    /// `--debug` / `--log-level`.
    pub fn set_threshold(&mut self, level: Level) {
        self.threshold = level;
    }

    /// One line (`RunnerTextFormatter.Format`). A failed write to stderr has nowhere to be
    /// reported, so it is dropped, as logrus drops it after printing to its own stderr.
    pub fn line(&mut self, level: Level, message: &str, fields: &[(&str, String)]) {
        if level < self.threshold {
            return;
        }
        let (color, prefix) = level.style();
        let width = 50usize.saturating_sub(prefix.len());
        let mut text = format!("{color}{prefix}{message}");
        let shown = message.chars().count();
        for _ in shown..width {
            text.push(' ');
        }
        text.push_str(ANSI_RESET);
        text.push(' ');
        let mut sorted: Vec<&(&str, String)> = fields.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(b.0));
        for (key, value) in sorted {
            text.push_str(&format!(" {color}{key}{ANSI_RESET}={value}"));
        }
        text.push('\n');
        let _ignored = self.out.write_all(text.as_bytes());
        let _ignored = self.out.flush();
    }

    /// Bytes a child process wrote to its stderr, passed through unformatted (the runner
    /// gives `git ls-files` its own stderr).
    pub fn raw(&mut self, bytes: &[u8]) {
        let _ignored = self.out.write_all(bytes);
    }

    /// `logrus.Debugln`.
    pub fn debug(&mut self, message: &str) {
        self.line(Level::Debug, message, &[]);
    }

    /// `logrus.Infoln`.
    pub fn info(&mut self, message: &str) {
        self.line(Level::Info, message, &[]);
    }

    /// `logrus.Warningln`.
    pub fn warn(&mut self, message: &str) {
        self.line(Level::Warn, message, &[]);
    }

    /// `logrus.Errorln`.
    pub fn error(&mut self, message: &str) {
        self.line(Level::Error, message, &[]);
    }

    /// `logrus.Fatalln`: the caller then ends the command with [`crate::ctx::Exit::FAILURE`].
    pub fn fatal(&mut self, message: &str) {
        self.line(Level::Fatal, message, &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_is_prefixed_padded_and_followed_by_sorted_fields() {
        let (mut log, captured) = Log::capture();
        log.line(
            Level::Warn,
            "Retrying...",
            &[("error", "boom".into()), ("context", "x".into())],
        );
        let expected = format!(
            "WARNING: Retrying...{}  context=x error=boom\n",
            " ".repeat(30)
        );
        assert_eq!(captured.text(), expected);
    }

    #[test]
    fn a_long_info_line_is_not_padded() {
        let (mut log, captured) = Log::capture();
        let message = "x".repeat(60);
        log.info(&message);
        assert_eq!(captured.text(), format!("{message} \n"));
    }

    #[test]
    fn debug_lines_are_hidden_at_the_default_threshold() {
        let (mut log, captured) = Log::capture();
        log.set_threshold(Level::Info);
        log.debug("hidden");
        assert_eq!(captured.text(), "");
    }
}
