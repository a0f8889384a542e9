//! A test guest that tries to escape the sandbox: files, environment, arguments, stdin,
//! sockets, DNS and a flood of stdout. `init` reports what each attempt got through the
//! test-only `flotilla:test/probe` import (one key per attempt), so the host tests can assert
//! that every attempt got nothing.
//!
//! Settings: `{"tcp": "127.0.0.1:PORT", "print_bytes": N, "log_lines": N}`.
#![allow(unsafe_code)] // wit-bindgen's generated export glue is unsafe; this crate's own code is not
#![allow(missing_docs)] // a component's API is its WIT; the generated bindings carry no docs

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};

wit_bindgen::generate!({
    path: "../../../wit",
    world: "flotilla:provider/provider",
    generate_all,
});

mod probe {
    wit_bindgen::generate!({
        path: "../../wit/probe.wit",
        world: "flotilla:test/reporter",
    });
    pub use self::flotilla::test::probe::report;
}

use exports::flotilla::provider::instance_group::Guest;
use flotilla::provider::types::{Capabilities, Connection, Error, Instance, ProviderInfo};

fn outcome<T: std::fmt::Debug, E: std::fmt::Display>(r: Result<T, E>) -> serde_json::Value {
    match r {
        Ok(v) => serde_json::json!({"ok": format!("{v:?}")}),
        Err(e) => serde_json::json!({"err": e.to_string()}),
    }
}

struct Escape;

impl Guest for Escape {
    fn init(settings: String) -> Result<ProviderInfo, Error> {
        let settings: serde_json::Value =
            serde_json::from_str(&settings).map_err(|e| Error::InvalidConfig(e.to_string()))?;
        let tcp = settings
            .get("tcp")
            .and_then(|v| v.as_str())
            .unwrap_or("127.0.0.1:1");
        let print_bytes = settings
            .get("print_bytes")
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        let write_to = settings
            .get("write_to")
            .and_then(|v| v.as_str())
            .unwrap_or("/tmp/flotilla-escape");
        let log_lines = settings
            .get("log_lines")
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        for i in 0..log_lines {
            flotilla::provider::log::emit(
                flotilla::provider::log::Level::Info,
                &format!("escape log line {i}"),
            );
        }

        let mut stdin = String::new();
        let report = serde_json::json!({
            "read_dir_root": outcome(std::fs::read_dir("/").map(|d| d.count())),
            "read_dir_dot": outcome(std::fs::read_dir(".").map(|d| d.count())),
            "read_passwd": outcome(std::fs::read_to_string("/etc/passwd")),
            "write_file": outcome(std::fs::write(write_to, b"x")),
            "env": std::env::vars().map(|(k, _)| k).collect::<Vec<_>>(),
            "args": std::env::args().collect::<Vec<_>>(),
            "stdin": outcome(std::io::stdin().read_to_string(&mut stdin).map(|n| (n, stdin.clone()))),
            "tcp_connect": outcome(TcpStream::connect(tcp).map(|_| "connected")),
            "dns": outcome(("localhost", 80).to_socket_addrs().map(|a| a.count())),
        });

        let chunk = vec![b'x'; 4096];
        let mut out = std::io::stdout();
        let mut left = print_bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            let _ = out.write_all(chunk.get(..n).unwrap_or_default()); // the host caps and may cut the output
            left -= n as u64;
        }
        let _ = out.flush();
        eprintln!("escape guest: stderr line");

        if let Some(fields) = report.as_object() {
            for (key, value) in fields {
                probe::report(key, &value.to_string());
            }
        }
        Ok(ProviderInfo {
            id: "test/escape".to_string(),
            version: "0.0.0".to_string(),
            max_size: 0,
            capabilities: Capabilities {
                heartbeat: false,
                expiring_connect_info: false,
            },
        })
    }

    fn update() -> Result<Vec<Instance>, Error> {
        Ok(Vec::new())
    }
    fn increase(_delta: u32) -> Result<u32, Error> {
        Ok(0)
    }
    fn decrease(_ids: Vec<String>) -> Result<Vec<String>, Error> {
        Ok(Vec::new())
    }
    fn connect_info(id: String) -> Result<Connection, Error> {
        Err(Error::NotFound(id))
    }
    fn heartbeat(_id: String) -> Result<(), Error> {
        Ok(())
    }
    fn shutdown() -> Result<(), Error> {
        Ok(())
    }
}

export!(Escape);
