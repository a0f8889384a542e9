//! Git smart HTTP: GitLab's authentication of CI jobs in front of Debian's `git http-backend`,
//! run as a CGI per request (git-http-backend(1): `GIT_PROJECT_ROOT`, `GIT_HTTP_EXPORT_ALL`,
//! the CGI variables, `GIT_PROTOCOL` from the `Git-Protocol` header, and
//! `HTTP_CONTENT_ENCODING` so the backend inflates gzip request bodies itself). The request
//! body streams in and the response streams out.
//!
//! Owns: the CGI exchange. Must not know: the artifacts API.

use std::path::Path;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http_body_util::BodyExt;
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::{Request, Response};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::{Answer, State, basic_auth, repo_exists, text};

const HTTP_BACKEND: &str = "/usr/lib/git-core/git-http-backend";

/// `group/name` and the rest of a path like `/group/name.git/info/refs`.
fn split_repo(path: &str) -> Option<(String, String)> {
    let at = path.find(".git/")?;
    let project = path[..at].trim_start_matches('/').to_string();
    let rest = path[at + 4..].to_string();
    (!project.is_empty() && !project.contains("..")).then_some((project, rest))
}

/// Checks the job token, then hands the request to the backend.
pub async fn serve(state: &Arc<Mutex<State>>, repos: &Path, req: Request<Incoming>) -> Answer {
    let Some((project, rest)) = split_repo(req.uri().path()) else {
        return text(404, "text/plain", "Not Found");
    };
    let query = req.uri().query().unwrap_or("");
    let push = rest == "/git-receive-pack" || query.contains("service=git-receive-pack");
    if let Some(refusal) = authorize(state, &req, &project, push) {
        return refusal;
    }
    if !repo_exists(repos, &project) {
        return text(404, "text/plain", "Not Found");
    }
    run_backend(state, repos, req).await
}

/// GitLab's answer for git over HTTP from a CI job: basic auth as `gitlab-ci-token` with the
/// token of a running job, else 401 with the `GitLab` realm and Rails' body
/// (`app/controllers/repositories/git_http_client_controller.rb`, `authenticate_user`); a
/// known token without read access, or any push, gets 403 with `Gitlab::GitAccess`'s message
/// (`lib/gitlab/git_access.rb` `ERROR_MESSAGES`).
fn authorize<B>(
    state: &Arc<Mutex<State>>,
    req: &Request<B>,
    project: &str,
    push: bool,
) -> Option<Answer> {
    let credentials = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(basic_auth);
    let state = state.lock().unwrap();
    let job = credentials
        .filter(|(user, _)| user == "gitlab-ci-token")
        .and_then(|(_, token)| state.job_of(&token).map(|(_, job)| job.project.clone()));
    let Some(source) = job else {
        let mut answer = text(401, "text/plain", "HTTP Basic: Access denied.\n");
        answer.headers_mut().insert(
            "www-authenticate",
            "Basic realm=\"GitLab\"".parse().expect("a header"),
        );
        return Some(answer);
    };
    if push {
        return Some(text(
            403,
            "text/plain",
            "You are not allowed to upload code for this project.",
        ));
    }
    (!state.can_read(&source, project)).then(|| {
        text(
            403,
            "text/plain",
            "You are not allowed to download code from this project.",
        )
    })
}

fn backend_command(repos: &Path, req: &Request<Incoming>) -> tokio::process::Command {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    let mut cmd = tokio::process::Command::new(HTTP_BACKEND);
    cmd.env_clear()
        .env("PATH", "/usr/lib/git-core:/usr/bin:/bin")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_PROJECT_ROOT", repos)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", req.uri().path())
        .env("REQUEST_METHOD", req.method().as_str())
        .env("QUERY_STRING", req.uri().query().unwrap_or(""))
        .env("REMOTE_USER", "gitlab-ci-token")
        .env("REMOTE_ADDR", "127.0.0.1")
        // What Gitaly runs upload-pack with, so a fetch may name a commit by its sha
        // (`internal/git/command_description.go`, "upload-pack").
        .env("GIT_CONFIG_COUNT", "2")
        .env("GIT_CONFIG_KEY_0", "uploadpack.allowFilter")
        .env("GIT_CONFIG_VALUE_0", "true")
        .env("GIT_CONFIG_KEY_1", "uploadpack.allowAnySHA1InWant")
        .env("GIT_CONFIG_VALUE_1", "true");
    let optional = [
        ("CONTENT_TYPE", header("content-type")),
        ("CONTENT_LENGTH", header("content-length")),
        ("GIT_PROTOCOL", header("git-protocol")),
        ("HTTP_CONTENT_ENCODING", header("content-encoding")),
    ];
    for (name, value) in optional {
        if let Some(value) = value {
            cmd.env(name, value);
        }
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// One CGI run: the body is copied to the backend's stdin while its response is read.
async fn run_backend(state: &Arc<Mutex<State>>, repos: &Path, req: Request<Incoming>) -> Answer {
    let mut child = backend_command(repos, &req)
        .spawn()
        .expect("git http-backend");
    let stdin = child.stdin.take().expect("stdin");
    tokio::spawn(pump_body(req.into_body(), stdin));
    let mut stderr = child.stderr.take().expect("stderr");
    let errors = state.clone();
    tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        errors.lock().unwrap().backend_errors.push_str(&text);
    });
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let Some(response) = cgi_headers(&mut stdout).await else {
        return text(502, "text/plain", "git http-backend ended without headers");
    };
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::spawn(async move {
        pump_output(stdout, tx).await;
        // Reaps the backend; its exit status is already in what it wrote.
        let _ = child.wait().await;
    });
    response.body(Streamed { rx }.boxed()).expect("a response")
}

/// Copies the request body to the backend; dropping stdin ends the body for it.
async fn pump_body(mut body: Incoming, mut stdin: tokio::process::ChildStdin) {
    while let Some(Ok(frame)) = body.frame().await {
        if let Ok(data) = frame.into_data()
            && stdin.write_all(&data).await.is_err()
        {
            break;
        }
    }
}

/// The CGI response headers: `Status:` (absent for 200) becomes the status, the others are
/// kept; `None` when the backend ends before the blank line.
async fn cgi_headers<R>(stdout: &mut R) -> Option<hyper::http::response::Builder>
where
    R: tokio::io::AsyncBufRead + Unpin,
{
    let mut response = Response::builder().status(200);
    loop {
        let mut line = String::new();
        if stdout.read_line(&mut line).await.unwrap_or(0) == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            return Some(response);
        }
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name.eq_ignore_ascii_case("status") {
            let code = value
                .trim()
                .split(' ')
                .next()
                .and_then(|c| c.parse::<u16>().ok());
            response = response.status(code.unwrap_or(500));
        } else {
            response = response.header(name.trim(), value.trim());
        }
    }
}

/// Forwards the backend's output, chunk by chunk, until it ends or the client goes.
async fn pump_output<R>(mut stdout: R, tx: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>)
where
    R: tokio::io::AsyncRead + Unpin,
{
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        let chunk = match stdout.read(&mut buffer).await {
            Ok(0) => return,
            Ok(n) => Ok(Bytes::copy_from_slice(&buffer[..n])),
            Err(e) => Err(e),
        };
        let failed = chunk.is_err();
        if tx.send(chunk).await.is_err() || failed {
            return;
        }
    }
}

/// The backend's output as a response body, chunk by chunk.
struct Streamed {
    rx: tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>,
}

impl Body for Streamed {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|r| r.map(Frame::data)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_paths_split_into_project_and_service() {
        assert_eq!(
            split_repo("/group/app.git/info/refs"),
            Some(("group/app".into(), "/info/refs".into()))
        );
        assert_eq!(split_repo("/a/../b.git/info/refs"), None);
        assert_eq!(split_repo("/app/info/refs"), None);
    }
}
