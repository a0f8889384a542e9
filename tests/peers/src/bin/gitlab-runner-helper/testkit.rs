//! Test support for the helper's unit tests: a tiny HTTP/1.1 server on 127.0.0.1 (one
//! thread, one request per connection, every request recorded), a project directory in a
//! temp dir, and a `Ctx` whose log can be read back.
//!
//! Owns: test fixtures only (compiled for tests).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::ctx::{Ctx, Env};
use crate::log::{Captured, Log};

/// A request the server saw.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What the server answers.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn new(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Reply {
        self.body = body.into();
        self
    }
}

/// A server on an ephemeral loopback port.
pub struct Server {
    pub base: String,
    requests: Arc<Mutex<Vec<Recorded>>>,
}

impl Server {
    pub fn start(handler: impl Fn(&Recorded) -> Reply + Send + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let base = format!("http://{}", listener.local_addr().expect("local addr"));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&requests);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                serve(stream, &handler, &seen);
            }
        });
        Server { base, requests }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().expect("requests lock").clone()
    }
}

/// Reads one request, records it (before answering, so a client that has its answer sees
/// it recorded), and answers it.
fn serve(
    stream: TcpStream,
    handler: &impl Fn(&Recorded) -> Reply,
    seen: &Mutex<Vec<Recorded>>,
) -> Option<()> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut headers = Vec::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    let length: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("Content-Length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let request = Recorded {
        method,
        target,
        headers,
        body,
    };
    seen.lock().expect("requests lock").push(request.clone());
    let reply = handler(&request);
    let mut out = format!("HTTP/1.1 {} {}\r\n", reply.status, reason(reply.status));
    for (name, value) in &reply.headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    if request.method != "HEAD"
        || !reply
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("Content-Length"))
    {
        out.push_str(&format!("Content-Length: {}\r\n", reply.body.len()));
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut stream = stream;
    let _ = stream.write_all(out.as_bytes());
    if request.method != "HEAD" {
        let _ = stream.write_all(&reply.body);
    }
    Some(())
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        206 => "Partial Content",
        302 => "Found",
        307 => "Temporary Redirect",
        403 => "Forbidden",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// A project directory (`<temp>/proj`) and a `Ctx` on it with the process environment plus
/// `extra`.
pub fn project(extra: &[(&str, &str)]) -> (tempfile::TempDir, Ctx, Captured) {
    let dir = tempfile::tempdir().expect("temp dir");
    let wd: PathBuf = dir.path().join("proj");
    std::fs::create_dir_all(&wd).expect("project dir");
    let mut env = Env::from_process();
    for (key, value) in extra {
        env.set(key, value);
    }
    let (log, captured) = Log::capture();
    (dir, Ctx { wd, env, log }, captured)
}

/// `args` as owned strings.
pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_string()).collect()
}

/// A bucket-like server: PUT stores the body (keyed by path, query ignored) with its
/// `Last-Modified` and `x-*-meta-*` headers; GET and HEAD answer them, or 404.
pub fn object_store() -> Server {
    type Stored = (Vec<u8>, Vec<(String, String)>);
    let objects: Arc<Mutex<std::collections::BTreeMap<String, Stored>>> = Arc::default();
    Server::start(move |request| {
        let path = request.target.split('?').next().unwrap_or("").to_string();
        let mut objects = objects.lock().expect("objects lock");
        match request.method.as_str() {
            "PUT" => {
                let kept = request
                    .headers
                    .iter()
                    .filter(|(n, _)| {
                        n.eq_ignore_ascii_case("Last-Modified")
                            || n.to_ascii_lowercase().contains("-meta-")
                    })
                    .cloned()
                    .collect();
                objects.insert(path, (request.body.clone(), kept));
                Reply::new(201)
            }
            "GET" | "HEAD" => match objects.get(&path) {
                Some((body, headers)) => {
                    let mut reply = Reply::new(200).body(body.clone());
                    if !headers
                        .iter()
                        .any(|(n, _)| n.eq_ignore_ascii_case("Last-Modified"))
                    {
                        reply = reply.header("Last-Modified", "Mon, 02 Jan 2006 15:04:05 GMT");
                    }
                    for (name, value) in headers {
                        reply = reply.header(name, value);
                    }
                    if request.method == "HEAD" {
                        reply = reply.header("Content-Length", &body.len().to_string());
                    }
                    reply.header("ETag", "\"etag-1\"")
                }
                None => Reply::new(404),
            },
            _ => Reply::new(405),
        }
    })
}
