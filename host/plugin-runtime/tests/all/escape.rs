//! One behaviour per test: the escape guest tries everything in `init` and reports each
//! attempt through the test probe; each test checks one of them.
use super::*;
use flotilla_harness::ProbeLog;
use serde_json::json;

/// What one run of the escape guest left: its reports, the host log, and whether anything
/// connected to the loopback listener it was pointed at.
struct Escaped {
    probe: ProbeLog,
    logs: String,
    connected: bool,
}

async fn escape(file: &std::path::Path) -> Escaped {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener
        .set_nonblocking(true)
        .expect("non-blocking listener");
    let port = listener.local_addr().expect("listener address").port();
    let capture = LogCapture::default();
    let _guard = capture.install();
    let probe = ProbeLog::default();
    let mut sandbox = quick_sandbox(&[]);
    sandbox.limits.output_bytes = 10_000;
    sandbox.limits.log_lines_per_call = 5;
    sandbox.probe = Some(probe.probe());
    let p = load(guests::ESCAPE).provider("escape", sandbox);
    let settings = json!({
        "tcp": format!("127.0.0.1:{port}"),
        "print_bytes": 1_000_000,
        "log_lines": 100,
        "write_to": file.display().to_string(),
    });
    must(p.init(&settings.to_string())).await;
    Escaped {
        probe,
        logs: capture.text(),
        connected: listener.accept().is_ok(),
    }
}

fn scratch(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("flotilla-escape-{name}-{}", std::process::id()))
}

async fn refused(key: &str) {
    let run = escape(&scratch(key)).await;
    let outcome = run.probe.json(key);
    assert!(outcome.get("err").is_some(), "{key} succeeded: {outcome}");
}

#[tokio::test(flavor = "current_thread")]
async fn the_guest_cannot_list_the_root_directory() {
    refused("read_dir_root").await;
}

#[tokio::test(flavor = "current_thread")]
async fn the_guest_has_no_working_directory() {
    refused("read_dir_dot").await;
}

#[tokio::test(flavor = "current_thread")]
async fn the_guest_cannot_read_host_files() {
    refused("read_passwd").await;
}

#[tokio::test(flavor = "current_thread")]
async fn the_guest_cannot_write_files() {
    let file = scratch("write");
    let _ = std::fs::remove_file(&file); // absent before is what the test needs
    let run = escape(&file).await;
    assert!(run.probe.json("write_file").get("err").is_some());
    assert!(!file.exists(), "the guest wrote {}", file.display());
}

#[tokio::test(flavor = "current_thread")]
async fn the_guest_sees_none_of_the_host_environment() {
    assert!(
        std::env::var_os("PATH").is_some(),
        "the test needs a host environment to leak"
    );
    let run = escape(&scratch("env")).await;
    assert_eq!(run.probe.json("env"), json!([]));
}

#[tokio::test(flavor = "current_thread")]
async fn the_guest_gets_no_arguments() {
    let run = escape(&scratch("args")).await;
    assert_eq!(run.probe.json("args"), json!([]));
}

#[tokio::test(flavor = "current_thread")]
async fn the_guest_reads_an_empty_stdin() {
    let run = escape(&scratch("stdin")).await;
    assert_eq!(run.probe.json("stdin")["ok"], "(0, \"\")");
}

#[tokio::test(flavor = "current_thread")]
async fn the_guest_cannot_open_a_tcp_connection() {
    let run = escape(&scratch("tcp")).await;
    assert!(run.probe.json("tcp_connect").get("err").is_some());
    assert!(!run.connected, "the guest reached the loopback listener");
}

#[tokio::test(flavor = "current_thread")]
async fn the_guest_cannot_resolve_names() {
    refused("dns").await;
}

#[tokio::test(flavor = "current_thread")]
async fn guest_stdout_is_logged_up_to_its_cap() {
    let run = escape(&scratch("stdout")).await;
    let printed = run
        .logs
        .lines()
        .filter(|l| l.contains("stream=\"stdout\""))
        .map(str::len)
        .sum::<usize>();
    assert!(printed > 0, "stdout is logged");
    assert!(
        run.logs.contains("output cap reached"),
        "the cap is reported"
    );
    assert!(
        printed < 10_000 + 4_096 * 4,
        "stdout was not capped: {printed} bytes logged"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn guest_stderr_is_logged() {
    let run = escape(&scratch("stderr")).await;
    assert!(
        run.logs.contains("escape guest: stderr line"),
        "{}",
        run.logs
    );
}

#[tokio::test(flavor = "current_thread")]
async fn guest_log_lines_are_capped_per_call() {
    let run = escape(&scratch("log")).await;
    let logged = run
        .logs
        .lines()
        .filter(|l| l.contains("escape log line"))
        .count();
    assert_eq!(logged, 5, "log lines are capped per call");
    assert!(
        run.logs.contains("plugin log cap reached"),
        "the log cap is reported"
    );
}
