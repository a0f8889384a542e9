//! A small HTTP/1.1 client over `std::net::TcpStream` (and rustls for `https`), in place of
//! Go's `net/http` as the helper uses it: one request per connection, `Content-Length`
//! request bodies, `Content-Length`, chunked or read-to-close response bodies, an overall
//! deadline (`http.Client.Timeout`), a response-header timeout
//! (`Transport.ResponseHeaderTimeout`), a dial timeout, and Go's redirect rules
//! (`Client.Do`: GET/HEAD follow 301/302/303/307/308; other methods follow 307/308 only when
//! the body can be sent again; at most 10 hops). Unlike Go, the `JOB-TOKEN`,
//! `Authorization` and `Cookie` headers are dropped when a redirect leaves the host.
//!
//! Errors read like Go's `*url.Error` (`Put "https://host/path": dial tcp …`) but always
//! show the URL without its query or user info: presigned URLs carry signatures there.
//! Proxies (`HTTP_PROXY`…) are not supported.
//!
//! Owns: the wire protocol. Must not know: GitLab, caches or archives.

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use url::Url;

use crate::tls::TlsFiles;

/// `url_helpers.CleanURL`: no user info, query or fragment.
pub fn clean_url(url: &Url) -> String {
    let mut shown = url.clone();
    let _ignored = shown.set_username("");
    let _ignored = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string()
}

/// A request failure, already worded for the job log.
#[derive(Debug, Clone)]
pub struct HttpError(pub String);

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A request body.
#[derive(Debug, Clone, Copy)]
pub enum Body<'a> {
    Empty,
    Bytes(&'a [u8]),
    /// A file sent with its size as `Content-Length` (not replayable on redirects, as Go's
    /// `http.NewRequest` with an `*os.File` body has no `GetBody`).
    File(&'a Path),
}

/// One request.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub method: &'static str,
    pub url: Url,
    pub headers: Vec<(String, String)>,
    pub body: Body<'a>,
}

impl<'a> Request<'a> {
    pub fn new(method: &'static str, url: Url) -> Request<'a> {
        Request {
            method,
            url,
            headers: Vec::new(),
            body: Body::Empty,
        }
    }

    /// Sets a header, replacing one of the same name (`Header.Set`).
    pub fn header(mut self, name: &str, value: &str) -> Request<'a> {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    pub fn body(mut self, body: Body<'a>) -> Request<'a> {
        self.body = body;
        self
    }

    fn failure(&self, cause: impl fmt::Display) -> HttpError {
        let method = self.method;
        let mut go_method = method.get(..1).unwrap_or("").to_string();
        go_method.push_str(&method.get(1..).unwrap_or("").to_lowercase());
        HttpError(format!("{go_method} \"{}\": {cause}", clean_url(&self.url)))
    }
}

/// Connection and timeout settings.
#[derive(Debug, Clone)]
pub struct Client {
    /// The whole exchange, body included (`http.Client.Timeout`); `None` is unlimited.
    pub timeout: Option<Duration>,
    pub header_timeout: Duration,
    pub dial_timeout: Duration,
    pub tls: TlsFiles,
    pub user_agent: String,
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

/// A connection that checks its deadlines before every read and write.
struct Conn {
    stream: Stream,
    control: TcpStream,
    deadline: Option<Instant>,
    phase: Option<(Instant, &'static str)>,
}

const OVERALL_TIMEOUT: &str = "context deadline exceeded (Client.Timeout exceeded)";

impl Conn {
    fn arm(&self) -> io::Result<()> {
        let mut limit = self.deadline.map(|d| (d, OVERALL_TIMEOUT));
        if let Some((phase, why)) = self.phase
            && limit.is_none_or(|(d, _)| phase < d)
        {
            limit = Some((phase, why));
        }
        let Some((at, why)) = limit else {
            self.control.set_read_timeout(None)?;
            return self.control.set_write_timeout(None);
        };
        let left = at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, why));
        }
        self.control.set_read_timeout(Some(left))?;
        self.control.set_write_timeout(Some(left))
    }

    fn timed_out(&self) -> io::Error {
        let why = self.phase.map_or(OVERALL_TIMEOUT, |(_, why)| why);
        io::Error::new(io::ErrorKind::TimedOut, why)
    }
}

fn is_timeout(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm()?;
        let result = match &mut self.stream {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        };
        result.map_err(|e| if is_timeout(&e) { self.timed_out() } else { e })
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm()?;
        let result = match &mut self.stream {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        };
        result.map_err(|e| if is_timeout(&e) { self.timed_out() } else { e })
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.stream {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

enum Framing {
    None,
    Length(u64),
    Chunked { left: u64, done: bool },
    Close,
}

/// A response whose body is read from the connection.
pub struct Response {
    pub status: u16,
    pub reason: String,
    pub headers: Vec<(String, String)>,
    /// The URL that answered (after redirects).
    pub url: Url,
    reader: BufReader<Conn>,
    framing: Framing,
}

impl Response {
    /// The first value of a header (names compare case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Go's `Response.Status`: `201 Created`.
    pub fn status_text(&self) -> String {
        format!("{} {}", self.status, self.reason)
            .trim_end()
            .to_string()
    }

    /// Up to `limit` bytes of the body; a read error ends it early (callers only show it).
    pub fn read_body(&mut self, limit: u64) -> Vec<u8> {
        let mut body = Vec::new();
        let _ignored = self.by_ref().take(limit).read_to_end(&mut body);
        body
    }

    fn chunk_size(&mut self) -> io::Result<u64> {
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let digits = line
            .trim()
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        u64::from_str_radix(&digits, 16)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "malformed chunked encoding"))
    }
}

impl Response {
    /// Reads at most `left` bytes of framed body into `buf`; EOF before that is an error.
    fn read_limited(&mut self, buf: &mut [u8], left: u64) -> io::Result<usize> {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let Some(slice) = buf.get_mut(..want) else {
            return Ok(0);
        };
        let n = self.reader.read(slice)?;
        if n == 0 && want > 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "unexpected EOF",
            ));
        }
        Ok(n)
    }

    fn read_chunked(&mut self, buf: &mut [u8], left: u64) -> io::Result<usize> {
        let left = if left > 0 {
            left
        } else {
            let size = self.chunk_size()?;
            if size == 0 {
                let mut line = String::new();
                while self.reader.read_line(&mut line)? > 2 {
                    line.clear();
                }
                self.framing = Framing::Chunked {
                    left: 0,
                    done: true,
                };
                return Ok(0);
            }
            size
        };
        let n = self.read_limited(buf, left)?;
        let rest = left - n as u64;
        if rest == 0 {
            let mut crlf = String::new();
            self.reader.read_line(&mut crlf)?;
        }
        self.framing = Framing::Chunked {
            left: rest,
            done: false,
        };
        Ok(n)
    }
}

impl Read for Response {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.framing {
            Framing::None | Framing::Chunked { done: true, .. } | Framing::Length(0) => Ok(0),
            Framing::Close => self.reader.read(buf),
            Framing::Length(left) => {
                let n = self.read_limited(buf, left)?;
                self.framing = Framing::Length(left - n as u64);
                Ok(n)
            }
            Framing::Chunked { left, done: false } => self.read_chunked(buf, left),
        }
    }
}

impl Client {
    /// Sends one request, following redirects as Go's client does.
    pub fn send(&self, request: Request<'_>) -> Result<Response, HttpError> {
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let mut request = request;
        for _ in 0..=10 {
            let response = self.exchange(&request, deadline)?;
            let Some(next) = redirect(&request, &response) else {
                return Ok(response);
            };
            request = next;
        }
        Err(request.failure("stopped after 10 redirects"))
    }

    /// Sends one request without following redirects (Go's `CheckRedirect` returning
    /// `http.ErrUseLastResponse`).
    pub fn send_once(&self, request: Request<'_>) -> Result<Response, HttpError> {
        let deadline = self.timeout.map(|t| Instant::now() + t);
        self.exchange(&request, deadline)
    }

    fn exchange(
        &self,
        request: &Request<'_>,
        deadline: Option<Instant>,
    ) -> Result<Response, HttpError> {
        let mut conn = self.connect(request, deadline)?;
        let written = write_request(&mut conn, request, &self.user_agent);
        conn.phase = Some((
            Instant::now() + self.header_timeout,
            "net/http: timeout awaiting response headers",
        ));
        let mut reader = BufReader::new(conn);
        let head = read_head(&mut reader);
        let (status, reason, headers) = match (head, written) {
            (Ok(head), _) => head,
            (Err(_), Err(write_error)) => return Err(request.failure(write_error)),
            (Err(read_error), Ok(())) => return Err(request.failure(read_error)),
        };
        reader.get_mut().phase = None;
        let framing = framing(request.method, status, &headers);
        Ok(Response {
            status,
            reason,
            headers,
            url: request.url.clone(),
            reader,
            framing,
        })
    }

    fn connect(&self, request: &Request<'_>, deadline: Option<Instant>) -> Result<Conn, HttpError> {
        let url = &request.url;
        let host = url
            .host_str()
            .ok_or_else(|| request.failure("no Host in request URL"))?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let port = url
            .port_or_known_default()
            .ok_or_else(|| request.failure("unsupported protocol scheme"))?;
        let addrs = (bare, port)
            .to_socket_addrs()
            .map_err(|e| request.failure(format!("dial tcp: lookup {bare}: {e}")))?;
        let mut last = None;
        let mut tcp = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, self.dial_timeout) {
                Ok(stream) => {
                    tcp = Some(stream);
                    break;
                }
                Err(e) => {
                    last = Some(format!(
                        "dial tcp {addr}: connect: {}",
                        crate::ctx::go_error(&e)
                    ))
                }
            }
        }
        let tcp = tcp.ok_or_else(|| {
            request
                .failure(last.unwrap_or_else(|| format!("dial tcp: lookup {bare}: no such host")))
        })?;
        let control = tcp.try_clone().map_err(|e| request.failure(e))?;
        let stream = match url.scheme() {
            "http" => Stream::Plain(tcp),
            "https" => {
                let config = self.tls.client_config().map_err(|e| request.failure(e))?;
                let name = rustls::pki_types::ServerName::try_from(bare.to_string())
                    .map_err(|e| request.failure(format!("tls: {e}")))?;
                let session = rustls::ClientConnection::new(Arc::clone(&config), name)
                    .map_err(|e| request.failure(format!("tls: {e}")))?;
                Stream::Tls(Box::new(rustls::StreamOwned::new(session, tcp)))
            }
            other => return Err(request.failure(format!("unsupported protocol scheme {other:?}"))),
        };
        Ok(Conn {
            stream,
            control,
            deadline,
            phase: None,
        })
    }
}

fn write_request(conn: &mut Conn, request: &Request<'_>, user_agent: &str) -> io::Result<()> {
    let (file, length) = match request.body {
        Body::Empty => (None, 0),
        Body::Bytes(bytes) => (None, bytes.len() as u64),
        Body::File(path) => {
            let opened = File::open(path)?;
            let size = opened.metadata()?.len();
            (Some(opened), size)
        }
    };
    conn.write_all(request_head(request, user_agent, length)?.as_bytes())?;
    match (request.body, file) {
        (Body::Bytes(bytes), _) => conn.write_all(bytes)?,
        (Body::File(_), Some(opened)) => {
            let mut reader = BufReader::with_capacity(1 << 20, opened).take(length);
            if io::copy(&mut reader, conn)? != length {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file shrank while being sent",
                ));
            }
        }
        _ => {}
    }
    conn.flush()
}

/// The request line and headers.
fn request_head(request: &Request<'_>, user_agent: &str, length: u64) -> io::Result<String> {
    let url = &request.url;
    let mut target = url.path().to_string();
    if let Some(query) = url.query() {
        target.push('?');
        target.push_str(query);
    }
    let host = match url.port() {
        Some(port) => format!("{}:{port}", url.host_str().unwrap_or("")),
        None => url.host_str().unwrap_or("").to_string(),
    };
    let mut head = format!("{} {target} HTTP/1.1\r\nHost: {host}\r\n", request.method);
    if !request
        .headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("User-Agent"))
    {
        head.push_str(&format!("User-Agent: {user_agent}\r\n"));
    }
    // Go's `Request.Write` writes these itself and never from the header map
    // (`net/http` `reqWriteExcludeHeader`): a presigned PUT's signed `host` header (the runner
    // passes every signed header as `--header`) must not become a second Host line.
    let written_by_go = ["Host", "Content-Length", "Transfer-Encoding", "Trailer"];
    for (name, value) in &request.headers {
        if written_by_go.iter().any(|w| name.eq_ignore_ascii_case(w)) {
            continue;
        }
        if name.contains(['\r', '\n', ':']) || value.contains(['\r', '\n']) {
            let why = format!("invalid header field {name:?}");
            return Err(io::Error::new(io::ErrorKind::InvalidInput, why));
        }
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if length > 0 || matches!(request.method, "POST" | "PUT" | "PATCH") {
        head.push_str(&format!("Content-Length: {length}\r\n"));
    }
    head.push_str("Connection: close\r\n\r\n");
    Ok(head)
}

type Head = (u16, String, Vec<(String, String)>);

fn read_head(reader: &mut BufReader<Conn>) -> io::Result<Head> {
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "EOF"));
        }
        let line = line.trim_end();
        let mut parts = line.splitn(3, ' ');
        let (version, code) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let status: u16 = code
            .parse()
            .ok()
            .filter(|_| version.starts_with("HTTP/"))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("malformed HTTP response {line:?}"),
                )
            })?;
        let reason = parts.next().unwrap_or("").to_string();
        let mut headers = Vec::new();
        let mut total = 0usize;
        loop {
            let mut header = String::new();
            total += reader.read_line(&mut header)?;
            if total > 1 << 20 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "response headers too large",
                ));
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                headers.push((name.trim().to_string(), value.trim().to_string()));
            }
        }
        if (100..200).contains(&status) && status != 101 {
            continue;
        }
        return Ok((status, reason, headers));
    }
}

fn framing(method: &str, status: u16, headers: &[(String, String)]) -> Framing {
    let get = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    if method == "HEAD" || status == 204 || status == 304 || (100..200).contains(&status) {
        return Framing::None;
    }
    if get("Transfer-Encoding").is_some_and(|te| te.to_ascii_lowercase().contains("chunked")) {
        return Framing::Chunked {
            left: 0,
            done: false,
        };
    }
    match get("Content-Length").and_then(|v| v.parse().ok()) {
        Some(length) => Framing::Length(length),
        None => Framing::Close,
    }
}

/// The follow-up request Go's client would send for a redirect response, if any.
fn redirect<'a>(request: &Request<'a>, response: &Response) -> Option<Request<'a>> {
    let status = response.status;
    let follows = match request.method {
        "GET" | "HEAD" => matches!(status, 301 | 302 | 303 | 307 | 308),
        _ => matches!(status, 307 | 308) && !matches!(request.body, Body::File(_)),
    };
    if !follows {
        return None;
    }
    let next_url = request.url.join(response.header("Location")?).ok()?;
    let same_host = next_url.host_str() == request.url.host_str()
        && next_url.port_or_known_default() == request.url.port_or_known_default();
    let mut next = request.clone();
    next.url = next_url;
    if !same_host {
        next.headers.retain(|(n, _)| {
            !["JOB-TOKEN", "Authorization", "Cookie", "Cookie2"]
                .iter()
                .any(|s| n.eq_ignore_ascii_case(s))
        });
    }
    Some(next)
}
