//! One SSH session to one instance: connect with deadlines, check the host key, authenticate
//! with the pool's key, and run commands with a time limit and capped output.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use russh::ChannelMsg;
use russh::keys::{PrivateKeyWithHashAlg, PublicKeyOrCertificate};

use crate::hostkeys::{HostKeyPolicy, Refusal};
use crate::keys::PoolKey;

/// Output kept per stream of a command; the rest is dropped.
const OUTPUT_CAP: usize = 16 * 1024;

/// Where to connect.
#[derive(Debug, Clone)]
pub struct Target {
    /// The instance id (host keys are pinned per id).
    pub instance: String,
    /// Address (IP or name), as the plugin reported it.
    pub host: String,
    /// The checked address it resolved to: where the connection goes.
    pub addr: std::net::SocketAddr,
    /// SSH port.
    pub port: u16,
    /// Login user.
    pub user: String,
}

/// Deadlines of a session.
#[derive(Debug, Clone, Copy)]
pub struct SshOptions {
    /// TCP connect plus the SSH handshake and authentication.
    pub connect_timeout: Duration,
    /// Keep-alive interval on an established session; three missed answers end it.
    pub keepalive_interval: Duration,
}

impl ConnectError {
    /// The readiness failure cause this error is counted under.
    pub fn cause(&self) -> &'static str {
        match self {
            ConnectError::Unreachable { .. } | ConnectError::Timeout { .. } => "ssh-connect",
            ConnectError::HostKey { .. } => "host-key",
            ConnectError::AuthRefused { .. } => "ssh-auth",
            ConnectError::Ssh { .. } => "ssh",
            ConnectError::CommandTimeout { .. } => "ready-command",
        }
    }
}

/// Why a session or a command failed; each message names the instance's side of it.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// TCP failed.
    #[error("cannot reach {target}: {why}")]
    Unreachable {
        /// host:port.
        target: String,
        /// What failed.
        why: String,
    },
    /// The connect or handshake deadline passed.
    #[error("{target}: no SSH session within {after:?}")]
    Timeout {
        /// host:port.
        target: String,
        /// The deadline.
        after: Duration,
    },
    /// The host key was refused.
    #[error("{target}: {why}")]
    HostKey {
        /// host:port.
        target: String,
        /// Why.
        why: String,
    },
    /// The server refused the pool's key.
    #[error(
        "{target}: the server refused the pool's key for user {user:?}; is the pool's public key in its authorized_keys?"
    )]
    AuthRefused {
        /// host:port.
        target: String,
        /// The login user.
        user: String,
    },
    /// Any other SSH failure.
    #[error("{target}: SSH: {why}")]
    Ssh {
        /// host:port.
        target: String,
        /// What failed.
        why: String,
    },
    /// A command ran past its time limit.
    #[error("{target}: `{command}` did not finish within {after:?}")]
    CommandTimeout {
        /// host:port.
        target: String,
        /// The command.
        command: String,
        /// The limit.
        after: Duration,
    },
}

/// What a finished command left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exit status; `None` when the command died of a signal or the server sent none.
    pub status: Option<u32>,
    /// Standard output, capped.
    pub stdout: Vec<u8>,
    /// Standard error, capped.
    pub stderr: Vec<u8>,
}

struct Checker {
    target: Target,
    policy: HostKeyPolicy,
    refused: Arc<Mutex<Option<Refusal>>>,
}

impl russh::client::Handler for Checker {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        shown: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let verdict = match shown {
            PublicKeyOrCertificate::PublicKey { key, .. } => self.policy.check(
                &self.target.instance,
                &self.target.host,
                self.target.port,
                key,
            ),
            PublicKeyOrCertificate::Certificate(_) => Err(Refusal::Certificate),
        };
        match verdict {
            Ok(()) => Ok(true),
            Err(refusal) => {
                *self.refused.lock() = Some(refusal);
                Ok(false)
            }
        }
    }
}

/// An authenticated SSH session to one instance.
pub struct Session {
    handle: russh::client::Handle<Checker>,
    label: String,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("target", &self.label)
            .finish()
    }
}

fn client_config(opts: &SshOptions) -> Arc<russh::client::Config> {
    Arc::new(russh::client::Config {
        keepalive_interval: Some(opts.keepalive_interval),
        keepalive_max: 3,
        inactivity_timeout: None,
        nodelay: true,
        // One host-key type, so a pinned key cannot "change" by a change of preference.
        preferred: russh::Preferred {
            key: std::borrow::Cow::Owned(vec![russh::keys::Algorithm::Ed25519]),
            ..Default::default()
        },
        ..Default::default()
    })
}

impl Session {
    /// Connects, checks the host key and logs in, all within `opts.connect_timeout`.
    pub async fn connect(
        target: &Target,
        key: &PoolKey,
        policy: &HostKeyPolicy,
        opts: &SshOptions,
    ) -> Result<Session, ConnectError> {
        let label = format!("{}:{}", target.host, target.port);
        let attempt = Session::open(target, key, policy, opts, &label);
        tokio::time::timeout(opts.connect_timeout, attempt)
            .await
            .map_err(|_| ConnectError::Timeout {
                target: label.clone(),
                after: opts.connect_timeout,
            })?
    }

    async fn open(
        target: &Target,
        key: &PoolKey,
        policy: &HostKeyPolicy,
        opts: &SshOptions,
        label: &str,
    ) -> Result<Session, ConnectError> {
        let tcp = tokio::net::TcpStream::connect(target.addr)
            .await
            .map_err(|e| ConnectError::Unreachable {
                target: label.to_string(),
                why: e.to_string(),
            })?;
        // Latency only: a socket that refuses TCP_NODELAY still works.
        let _ = tcp.set_nodelay(true);
        let refused = Arc::new(Mutex::new(None));
        let checker = Checker {
            target: target.clone(),
            policy: policy.clone(),
            refused: refused.clone(),
        };
        let ssh_err = |why: String| ConnectError::Ssh {
            target: label.to_string(),
            why,
        };
        let mut handle =
            match russh::client::connect_stream(client_config(opts), tcp, checker).await {
                Ok(handle) => handle,
                Err(e) => {
                    return Err(match refused.lock().take() {
                        Some(refusal) => ConnectError::HostKey {
                            target: label.to_string(),
                            why: refusal.to_string(),
                        },
                        None => ssh_err(e.to_string()),
                    });
                }
            };
        let auth = handle
            .authenticate_publickey(
                target.user.clone(),
                PrivateKeyWithHashAlg::new(key.private(), None),
            )
            .await
            .map_err(|e| ssh_err(e.to_string()))?;
        if !auth.success() {
            return Err(ConnectError::AuthRefused {
                target: label.to_string(),
                user: target.user.clone(),
            });
        }
        Ok(Session {
            handle,
            label: label.to_string(),
        })
    }

    /// A byte stream to a unix socket on the instance (`direct-streamlocal@openssh.com`).
    pub async fn open_unix_socket(&self, path: &str) -> Result<PeerClosed, ConnectError> {
        let channel = self
            .handle
            .channel_open_direct_streamlocal(path)
            .await
            .map_err(|e| ConnectError::Ssh {
                target: self.label.clone(),
                why: format!("cannot open {path} on the instance: {e}"),
            })?;
        Ok(PeerClosed(Some(channel.into_stream()), false))
    }

    /// `host:port` of the machine.
    pub fn target(&self) -> &str {
        &self.label
    }

    /// Whether the session has ended (the machine or its sshd went away).
    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// Starts `command` (through the login shell) on a channel of its own, for the caller to
    /// feed and read; no time limit.
    pub async fn open_exec(
        &self,
        command: &str,
    ) -> Result<russh::Channel<russh::client::Msg>, ConnectError> {
        self.open_exec_with(command, None).await
    }

    /// [`Session::open_exec`], on a pseudo-terminal of `pty`'s size when given (`TERM` is
    /// `xterm-256color`, the terminal type most operators' emulators speak).
    pub async fn open_exec_with(
        &self,
        command: &str,
        pty: Option<crate::exec::Pty>,
    ) -> Result<russh::Channel<russh::client::Msg>, ConnectError> {
        let ssh_err = |e: russh::Error| ConnectError::Ssh {
            target: self.label.clone(),
            why: e.to_string(),
        };
        let channel = self.handle.channel_open_session().await.map_err(ssh_err)?;
        if let Some(pty) = pty {
            channel
                // No reply asked: a server that gives no terminal (`PermitTTY no`) still runs
                // the command, and a refusal would read as the command's own.
                .request_pty(
                    false,
                    "xterm-256color",
                    u32::from(pty.cols),
                    u32::from(pty.rows),
                    0,
                    0,
                    &[],
                )
                .await
                .map_err(ssh_err)?;
        }
        channel.exec(true, command).await.map_err(ssh_err)?;
        Ok(channel)
    }

    /// Runs `command` (through the login shell) and waits at most `limit` for it to end.
    /// Past the limit the command is sent SIGKILL and its channel closed.
    pub async fn exec(&self, command: &str, limit: Duration) -> Result<ExecOutput, ConnectError> {
        let ssh_err = |e: russh::Error| ConnectError::Ssh {
            target: self.label.clone(),
            why: e.to_string(),
        };
        let mut channel = self.handle.channel_open_session().await.map_err(ssh_err)?;
        channel.exec(true, command).await.map_err(ssh_err)?;
        let mut out = ExecOutput {
            status: None,
            stdout: Vec::new(),
            stderr: Vec::new(),
        };
        let collect = async {
            while let Some(msg) = channel.wait().await {
                match msg {
                    ChannelMsg::Data { data } => extend_capped(&mut out.stdout, &data),
                    ChannelMsg::ExtendedData { data, ext: 1 } => {
                        extend_capped(&mut out.stderr, &data)
                    }
                    ChannelMsg::ExitStatus { exit_status } => out.status = Some(exit_status),
                    ChannelMsg::Failure => break,
                    _ => {}
                }
            }
        };
        if tokio::time::timeout(limit, collect).await.is_err() {
            // Best effort: servers that do not support the signal request ignore it, and the
            // command is then left to the session's end.
            let _ = channel.signal(russh::Sig::KILL).await;
            let _ = channel.close().await;
            return Err(ConnectError::CommandTimeout {
                target: self.label.clone(),
                command: command.to_string(),
                after: limit,
            });
        }
        Ok(out)
    }
}

fn extend_capped(buf: &mut Vec<u8>, data: &[u8]) {
    let room = OUTPUT_CAP.saturating_sub(buf.len());
    buf.extend_from_slice(data.get(..room.min(data.len())).unwrap_or_default());
}

/// A channel's byte stream that, when dropped, lets the server close the channel first: it
/// sends EOF, reads until the server's close (at most [`CLOSE_WAIT`]), and only then drops the
/// channel.
///
/// russh 0.65 forgets a channel on the server's `CHANNEL_CLOSE` only while it still counts the
/// channel as open: when the client closes first, the server's answering close is ignored, and
/// the client's entry for the channel (its message queue, a few KiB) stays for the session's
/// life. Every Docker request through a lease is one channel, so a host serving jobs grew by
/// about 170 KiB per job (heaptrack: `tokio::sync::mpsc::chan::channel` under `Route::open`).
/// When the server closes first, both sides forget the channel.
pub struct PeerClosed(Option<russh::ChannelStream<russh::client::Msg>>, bool);

/// How long a dropped stream waits for the server to close its channel.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Drop for PeerClosed {
    fn drop(&mut self) {
        let Some(mut stream) = self.0.take() else {
            return;
        };
        let shut = self.1;
        // Outside a runtime (a test's teardown) the channel is closed at once.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            if !shut {
                let _ = stream.shutdown().await;
            }
            let mut sink = [0u8; 4096];
            let _ = tokio::time::timeout(CLOSE_WAIT, async {
                while let Ok(n) = stream.read(&mut sink).await {
                    if n == 0 {
                        break;
                    }
                }
            })
            .await;
        });
    }
}

impl tokio::io::AsyncRead for PeerClosed {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.0.as_mut() {
            Some(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            None => std::task::Poll::Ready(Ok(())),
        }
    }
}

impl tokio::io::AsyncWrite for PeerClosed {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.0.as_mut() {
            Some(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            None => std::task::Poll::Ready(Err(std::io::ErrorKind::NotConnected.into())),
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.0.as_mut() {
            Some(s) => std::pin::Pin::new(s).poll_flush(cx),
            None => std::task::Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = &mut *self;
        match this.0.as_mut() {
            Some(s) => {
                let done = std::pin::Pin::new(s).poll_shutdown(cx);
                if matches!(done, std::task::Poll::Ready(Ok(()))) {
                    this.1 = true;
                }
                done
            }
            None => std::task::Poll::Ready(Ok(())),
        }
    }
}
