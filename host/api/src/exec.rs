//! `POST /v1/pools/{pool}/leases/{id}/exec`: one command on the lease's machine, run by the
//! host over its own SSH session, so the caller never holds the pool's key.
//!
//! The request is an [`ExecRequest`] (JSON). The answer is `200` with content type
//! [`CONTENT_TYPE`] and a body of frames, each a 5-byte header (the [`FrameKind`] byte, then
//! the payload's length as a big-endian `u32`) and its payload:
//! - `stdout` and `stderr` carry the command's bytes as they come;
//! - `exit` (last) carries an [`ExitFrame`] as JSON;
//! - `broken` (last) says in words why the command's channel broke before it exited (the
//!   machine or the session went away, or the lease ended).
//!
//! A body that ends without `exit` or `broken` was cut in transit. Refusals before the command
//! starts are the API's usual error answers.
//!
//! `GET /v1/pools/{pool}/leases/{id}/terminal?command=…[&rows=R&cols=C]`, with
//! `Connection: Upgrade` and `Upgrade: flotilla-terminal` ([`TERMINAL_UPGRADE`]), is the
//! interactive form: an operator's shell on the machine of an instance-mode job. The query is a
//! [`TerminalRequest`]. The answer is `101 Switching Protocols`; after it, the caller writes its
//! keystrokes as raw bytes (closing its side ends the command's input), and reads the same
//! frames as an exec answer's. With `rows` and `cols` the command gets a pseudo-terminal of that
//! size, and its output comes as `stdout` only.

use serde::{Deserialize, Serialize};

/// The content type of an exec answer's body.
pub const CONTENT_TYPE: &str = "application/vnd.flotilla.exec-stream";

/// The largest payload one frame carries; a reader refuses larger ones.
pub const MAX_FRAME: usize = 1 << 20;

/// The largest standard input a request may carry (before base64).
pub const MAX_STDIN: usize = 64 << 20;

/// The body of an exec request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// The command line, as the machine's SSH server hands it to the login user's shell.
    pub command: String,
    /// Standard input, base64 (standard alphabet, padded); closed after it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stdin_base64: String,
}

/// The protocol an operator's terminal upgrades to.
pub const TERMINAL_UPGRADE: &str = "flotilla-terminal";

/// The query of a terminal request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TerminalRequest {
    /// The command line, as the machine's SSH server hands it to the login user's shell.
    pub command: String,
    /// The operator's terminal rows; with `cols`, the command gets a pseudo-terminal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u16>,
    /// The operator's terminal columns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cols: Option<u16>,
}

/// What one frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Bytes the command wrote to standard output.
    Stdout = 1,
    /// Bytes the command wrote to standard error.
    Stderr = 2,
    /// The command ended: an [`ExitFrame`].
    Exit = 3,
    /// The channel broke before the command ended: why, in words.
    Broken = 4,
}

impl FrameKind {
    fn from_byte(b: u8) -> Option<FrameKind> {
        match b {
            1 => Some(FrameKind::Stdout),
            2 => Some(FrameKind::Stderr),
            3 => Some(FrameKind::Exit),
            4 => Some(FrameKind::Broken),
            _ => None,
        }
    }
}

/// How the command ended, as the SSH server reported it (RFC 4254 §6.10).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitFrame {
    /// The exit status (`exit-status`), when the command exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u32>,
    /// The signal's name without `SIG` (`exit-signal`), when a signal ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
}

/// One frame: its header and payload.
pub fn encode(kind: FrameKind, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(kind as u8);
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Reads frames out of a body that arrives in pieces.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

/// Why a body is not a frame stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadFrame(pub String);

impl std::fmt::Display for BadFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed exec stream: {}", self.0)
    }
}

impl std::error::Error for BadFrame {}

impl Decoder {
    /// Takes the next piece of the body.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<(FrameKind, Vec<u8>)>, BadFrame> {
        let Some(header) = self.buf.get(..5) else {
            return Ok(None);
        };
        let kind = header.first().copied().unwrap_or_default();
        let kind = FrameKind::from_byte(kind)
            .ok_or_else(|| BadFrame(format!("unknown frame kind {kind}")))?;
        let mut len = [0u8; 4];
        len.copy_from_slice(header.get(1..5).unwrap_or(&[0; 4]));
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_FRAME {
            return Err(BadFrame(format!(
                "a frame of {len} bytes (at most {MAX_FRAME})"
            )));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let payload = self.buf.get(5..5 + len).unwrap_or_default().to_vec();
        self.buf.drain(..5 + len);
        Ok(Some((kind, payload)))
    }

    /// Bytes received that are not yet a whole frame (a body that ends with some was cut).
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_back_whatever_the_pieces() {
        let exit = serde_json::to_vec(&ExitFrame {
            status: Some(3),
            signal: None,
        })
        .expect("json");
        let mut body = encode(FrameKind::Stdout, b"out\n");
        body.extend(encode(FrameKind::Stderr, &[0, 255, 10]));
        body.extend(encode(FrameKind::Stdout, b""));
        body.extend(encode(FrameKind::Exit, &exit));
        for piece in [1, 2, 5, 7, body.len()] {
            let mut d = Decoder::default();
            let mut got = Vec::new();
            for chunk in body.chunks(piece) {
                d.push(chunk);
                while let Some(frame) = d.next_frame().expect("frames") {
                    got.push(frame);
                }
            }
            assert_eq!(d.pending(), 0);
            assert_eq!(
                got,
                vec![
                    (FrameKind::Stdout, b"out\n".to_vec()),
                    (FrameKind::Stderr, vec![0, 255, 10]),
                    (FrameKind::Stdout, Vec::new()),
                    (FrameKind::Exit, exit.clone()),
                ]
            );
        }
    }

    #[test]
    fn a_bad_kind_or_an_oversized_frame_is_refused() {
        let mut d = Decoder::default();
        d.push(&[9, 0, 0, 0, 0]);
        assert!(d.next_frame().is_err());
        let mut d = Decoder::default();
        d.push(&[1, 0xff, 0xff, 0xff, 0xff]);
        let err = d.next_frame().expect_err("oversized");
        assert!(err.to_string().contains("at most"), "{err}");
    }
}
