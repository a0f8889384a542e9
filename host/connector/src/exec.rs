//! A lease holder's command on its leased machine, run by the host over the machine's SSH
//! session (the GitLab driver's instance mode): standard input is sent and closed, standard
//! output and error come back as they arrive, then how the command ended. The holder never
//! holds the pool's key. The channel is tied to the lease's token like a Docker channel: when
//! the lease ends, the command is sent `KILL` and its channel closed. A holder that stops
//! reading (it went away) has its command sent `TERM`, which OpenSSH delivers to the command's
//! whole process group.

use std::sync::Arc;

use flotilla_provider::Provider;
use russh::{ChannelMsg, Sig};
use tokio::sync::mpsc;

use crate::proxy::ForwardError;
use crate::readiness::Connector;

/// What a running command reports, in order; `Exited` or `Broken` comes last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    /// Bytes on standard output.
    Stdout(Vec<u8>),
    /// Bytes on standard error.
    Stderr(Vec<u8>),
    /// The command ended: its exit status, or the signal that ended it (name without `SIG`).
    Exited {
        /// `exit-status`.
        status: Option<u32>,
        /// `exit-signal`.
        signal: Option<String>,
    },
    /// The channel broke before the command ended.
    Broken(String),
}

/// What a command reads on standard input.
#[derive(Debug)]
pub enum ExecInput {
    /// These bytes, then the end of input (a stage's script).
    Once(Vec<u8>),
    /// Whatever arrives, as it arrives; the end of input when the sender is dropped (an
    /// operator's keystrokes).
    Stream(mpsc::Receiver<Vec<u8>>),
}

/// A pseudo-terminal for the command (`pty-req`, RFC 4254 section 6.2), of this size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pty {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// How long the last event waits for room before the stream just ends (the reader then sees
/// a cut stream).
const LAST_SEND: std::time::Duration = std::time::Duration::from_secs(5);

/// How the command's channel ended, for the host.
enum End {
    /// The lease ended: the command is killed.
    LeaseEnded,
    /// The reader went away: the command is stopped.
    ReaderGone,
    /// This last event is said.
    Say(ExecEvent),
}

/// Events buffered between the machine and a slow reader; past it the SSH window closes and
/// the command waits.
const BUFFERED: usize = 64;

fn signal_name(sig: &Sig) -> String {
    match sig {
        Sig::ABRT => "ABRT",
        Sig::ALRM => "ALRM",
        Sig::FPE => "FPE",
        Sig::HUP => "HUP",
        Sig::ILL => "ILL",
        Sig::INT => "INT",
        Sig::KILL => "KILL",
        Sig::PIPE => "PIPE",
        Sig::QUIT => "QUIT",
        Sig::SEGV => "SEGV",
        Sig::TERM => "TERM",
        Sig::USR1 => "USR1",
        Sig::Custom(name) => name.as_str(),
    }
    .to_string()
}

impl Connector {
    /// Starts `command` on `instance` for the holder of `lease`, feeding it `stdin`; its
    /// events. Fails before anything runs when the machine cannot be reached or is not an SSH
    /// instance.
    pub async fn exec(
        &self,
        provider: &dyn Provider,
        instance: &str,
        lease: u64,
        command: &str,
        stdin: Vec<u8>,
    ) -> Result<mpsc::Receiver<ExecEvent>, ForwardError> {
        self.exec_with(
            provider,
            instance,
            lease,
            command,
            ExecInput::Once(stdin),
            None,
        )
        .await
    }

    /// [`Connector::exec`] with input that may keep coming, and a pseudo-terminal when `pty`
    /// is given (an operator's interactive session: the command's output then comes as
    /// standard output only, as a terminal shows it).
    pub async fn exec_with(
        &self,
        provider: &dyn Provider,
        instance: &str,
        lease: u64,
        command: &str,
        input: ExecInput,
        pty: Option<Pty>,
    ) -> Result<mpsc::Receiver<ExecEvent>, ForwardError> {
        let (mut session, token) = self.shell_session(provider, instance, lease).await?;
        let channel = match session.open_exec_with(command, pty).await {
            Ok(channel) => channel,
            Err(e) => {
                // A kept session that turned out closed is replaced once; one that is up but
                // refused another channel has MaxSessions commands running, and this one
                // gets a connection of its own.
                if session.is_closed() {
                    self.drop_session(instance, &session);
                    session = self.shell_session(provider, instance, lease).await?.0;
                } else {
                    session = self.extra_session(provider, instance).await?;
                }
                session.open_exec_with(command, pty).await.map_err(|_| {
                    ForwardError::Unreachable {
                        instance: instance.to_string(),
                        why: e.to_string(),
                    }
                })?
            }
        };
        let (tx, rx) = mpsc::channel(BUFFERED);
        tokio::spawn(follow(session, channel, token, input, tx));
        Ok(rx)
    }
}

/// Feeds `input` to the command's channel, closing its input at the end. A command that exits
/// without reading its input makes a write fail: nothing to do about it.
async fn feed(write: Arc<russh::ChannelWriteHalf<russh::client::Msg>>, input: ExecInput) {
    match input {
        ExecInput::Once(stdin) => {
            if !stdin.is_empty() {
                let _ = write.data(stdin.as_slice()).await;
            }
        }
        ExecInput::Stream(mut keys) => {
            while let Some(typed) = keys.recv().await {
                if write.data(typed.as_slice()).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = write.eof().await;
}

/// Follows one command's channel on `session` to its end, handing its events to `tx`: every
/// wait also watches the lease's end (the command is killed) and the reader's departure (it
/// is stopped), so a stalled reader never holds the command past either. The channel is
/// closed in every case, and `session`, when it is a connection of its own, lives as long.
async fn follow(
    session: Arc<crate::ssh::Session>,
    channel: russh::Channel<russh::client::Msg>,
    token: tokio_util::sync::CancellationToken,
    input: ExecInput,
    tx: mpsc::Sender<ExecEvent>,
) {
    let label = session.target().to_string();
    let (mut read, write) = channel.split();
    let write = Arc::new(write);
    let feeder = tokio::spawn(feed(write.clone(), input));
    let last = relay(&mut read, &token, &tx, &label).await;
    feeder.abort();
    let say = match last {
        End::LeaseEnded => {
            let _ = write.signal(Sig::KILL).await;
            Some(ExecEvent::Broken(
                "the lease ended; the command was killed".into(),
            ))
        }
        // Nobody reads any more: stop the command's process group.
        End::ReaderGone => {
            let _ = write.signal(Sig::TERM).await;
            None
        }
        End::Say(event) => Some(event),
    };
    // Closed in every case: a channel left open holds one of the machine's
    // MaxSessions.
    let _ = write.close().await;
    if let Some(event) = say {
        // Never waiting long on a reader that stopped reading.
        let _ = tokio::time::timeout(LAST_SEND, tx.send(event)).await;
    }
    // A connection of its own lived as long as its command.
    drop(session);
}

/// Hands the command's output to `tx` until the command ends (the last event to say), the
/// lease ends, or the reader goes away.
async fn relay(
    read: &mut russh::ChannelReadHalf,
    token: &tokio_util::sync::CancellationToken,
    tx: &mpsc::Sender<ExecEvent>,
    label: &str,
) -> End {
    let mut status = None;
    let mut signal = None;
    loop {
        let event = tokio::select! {
            () = token.cancelled() => break End::LeaseEnded,
            () = tx.closed() => break End::ReaderGone,
            msg = read.wait() => match msg {
                Some(ChannelMsg::Data { data }) => ExecEvent::Stdout(data.to_vec()),
                Some(ChannelMsg::ExtendedData { data, ext: 1 }) => {
                    ExecEvent::Stderr(data.to_vec())
                }
                Some(ChannelMsg::ExitStatus { exit_status }) => {
                    status = Some(exit_status);
                    continue;
                }
                Some(ChannelMsg::ExitSignal { signal_name: sig, .. }) => {
                    signal = Some(signal_name(&sig));
                    continue;
                }
                Some(ChannelMsg::Failure) => {
                    break End::Say(ExecEvent::Broken(format!(
                        "{label}: the SSH server refused to run the command"
                    )));
                }
                Some(ChannelMsg::Close) | None => {
                    break End::Say(if status.is_some() || signal.is_some() {
                        ExecEvent::Exited { status, signal }
                    } else {
                        ExecEvent::Broken(format!(
                            "{label}: the SSH channel closed before the command ended (the machine or its sshd went away)"
                        ))
                    });
                }
                Some(_) => continue,
            }
        };
        tokio::select! {
            () = token.cancelled() => break End::LeaseEnded,
            sent = tx.send(event) => if sent.is_err() { break End::ReaderGone },
        }
    }
}
