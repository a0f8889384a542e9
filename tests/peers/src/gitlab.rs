//! A stand-in GitLab for CI jobs: git over smart HTTP (Debian's `git http-backend` run as a
//! CGI per request), authenticated as GitLab authenticates CI jobs (`gitlab-ci-token` and a
//! job token), and the jobs artifacts API GitLab Runner's helper uses (upload, download, and
//! the `direct_download` redirect to "object storage" served under another path prefix).
//! No GitLab can run here; each behaviour cites the GitLab source or docs it copies.
//!
//! Repositories are made on disk by the test ([`GitLab::publish`] from a [`WorkTree`]); pushing
//! over HTTP is refused, as a job token may not push.
//!
//! Owns: the server, its jobs, tokens, repositories and stored artifacts, and a request log.
//! Must not know: the runner's scripts or any Flotilla crate.

mod artifacts;
mod git_http;
mod work_tree;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};

pub use work_tree::{WorkTree, git};

/// Debian's git, which the tests' helper image also carries.
pub const GIT: &str = "/usr/bin/git";

/// Every answer's body: canned bytes or a CGI's streamed output.
type Answer = Response<BoxBody<Bytes, std::io::Error>>;

/// What the server is started with.
#[derive(Debug, Clone)]
pub struct Options {
    /// Artifacts live in "object storage": `?direct_download=true` downloads are redirected
    /// to a signed URL of this server's `/object-storage/` prefix.
    pub object_storage: bool,
    /// Uploads above this many bytes are refused with 413 (`max_artifacts_size`).
    pub max_artifact_size: u64,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            object_storage: false,
            max_artifact_size: 100 << 20,
        }
    }
}

/// A job as the tests create it: its id and its token (`CI_JOB_ID`, `CI_JOB_TOKEN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobToken {
    pub id: u64,
    pub token: String,
}

/// One request as the server saw it. Secrets in the query are replaced by `[REDACTED]`.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    /// A `JOB-TOKEN` header was sent.
    pub job_token: bool,
    /// The user of a basic `Authorization` header.
    pub basic_user: Option<String>,
    pub content_encoding: Option<String>,
    pub git_protocol: Option<String>,
    pub status: u16,
}

/// An uploaded artifact with the query it came with.
#[derive(Debug, Clone)]
pub struct StoredArtifact {
    pub bytes: Vec<u8>,
    pub filename: String,
    pub artifact_format: String,
    pub artifact_type: String,
    pub expire_in: Option<String>,
}

struct Job {
    project: String,
    token: String,
    running: bool,
}

struct State {
    options: Options,
    jobs: BTreeMap<u64, Job>,
    next_job: u64,
    next_pipeline: u64,
    /// `(target, source)`: jobs of `source` may read `target` (the job token allowlist).
    allowed: Vec<(String, String)>,
    artifacts: BTreeMap<u64, StoredArtifact>,
    seen: Vec<Seen>,
    backend_errors: String,
    signing_key: ring::hmac::Key,
}

impl State {
    /// The running job a token belongs to (`Ci::AuthJobFinder`: tokens die with their job).
    fn job_of(&self, token: &str) -> Option<(u64, &Job)> {
        self.jobs
            .iter()
            .find(|(_, j)| j.running && j.token == token)
            .map(|(id, j)| (*id, j))
    }

    /// Whether a job of `source` may read `target`: its own project, or one whose job token
    /// allowlist names it (GitLab docs, "GitLab CI/CD job token": "By default, the job
    /// token's group or project must be added to the target project's allowlist",
    /// https://docs.gitlab.com/ci/jobs/ci_job_token/).
    fn can_read(&self, source: &str, target: &str) -> bool {
        source == target || self.allowed.iter().any(|(t, s)| t == target && s == source)
    }
}

/// A running stand-in; it stops with the test's runtime.
#[derive(Clone)]
pub struct GitLab {
    /// `http://<ip>:<port>`, without a trailing slash (`CI_SERVER_URL`).
    pub url: String,
    state: Arc<Mutex<State>>,
    repos: Arc<tempfile::TempDir>,
}

impl GitLab {
    /// Serves on a free port of `ip` (e.g. [`crate::netaddr::PEER_IP`] for containers).
    pub async fn start(ip: IpAddr, options: Options) -> GitLab {
        let rng = ring::rand::SystemRandom::new();
        let signing_key = ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &rng).expect("a key");
        let state = Arc::new(Mutex::new(State {
            options,
            jobs: BTreeMap::new(),
            next_job: 1000,
            next_pipeline: 1,
            allowed: Vec::new(),
            artifacts: BTreeMap::new(),
            seen: Vec::new(),
            backend_errors: String::new(),
            signing_key,
        }));
        let repos = Arc::new(tempfile::tempdir().expect("a repositories dir"));
        let (shared, root) = (state.clone(), repos.path().to_path_buf());
        let addr =
            crate::serve::serve_http_on(ip, move |req| handle(shared.clone(), root.clone(), req))
                .await;
        GitLab {
            url: format!("http://{addr}"),
            state,
            repos,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    /// Where the bare repository of `project` (`group/name`) lives.
    pub fn repo_dir(&self, project: &str) -> PathBuf {
        self.repos.path().join(format!("{project}.git"))
    }

    /// Makes (or updates) the bare repository `project` with every branch and tag of `work`;
    /// its default branch (`HEAD`) is `main`.
    pub fn publish(&self, project: &str, work: &WorkTree) {
        let bare = self.repo_dir(project);
        if !bare.exists() {
            std::fs::create_dir_all(&bare).expect("the repository dir");
            git(
                &bare,
                &["init", "--quiet", "--bare", "--initial-branch", "main"],
            );
        }
        let target = bare.to_str().expect("a UTF-8 path");
        git(
            work.path(),
            &[
                "push",
                "--quiet",
                "--force",
                target,
                "+refs/heads/*:refs/heads/*",
                "+refs/tags/*:refs/tags/*",
            ],
        );
    }

    /// The sha `rev` names in `project`'s repository.
    pub fn rev(&self, project: &str, rev: &str) -> String {
        git(&self.repo_dir(project), &["rev-parse", rev])
            .trim()
            .to_string()
    }

    /// A new pipeline for `sha`: GitLab keeps its commit reachable as `refs/pipelines/<id>`
    /// (the persistent ref the runner's refspecs fetch). Returns the pipeline id.
    pub fn pipeline(&self, project: &str, sha: &str) -> u64 {
        let id = self.with(|s| {
            s.next_pipeline += 1;
            s.next_pipeline
        });
        git(
            &self.repo_dir(project),
            &["update-ref", &format!("refs/pipelines/{id}"), sha],
        );
        id
    }

    /// A new running job of `project` with a fresh job token.
    pub fn job(&self, project: &str) -> JobToken {
        let token = format!("glcbt-{}", random_text(20));
        self.with(|s| {
            s.next_job += 1;
            let id = s.next_job;
            let job = Job {
                project: project.into(),
                token: token.clone(),
                running: true,
            };
            s.jobs.insert(id, job);
            JobToken { id, token }
        })
    }

    /// The job ends: its token is no longer accepted (GitLab docs, "GitLab CI/CD job token":
    /// "After the job finishes, the token access is revoked").
    pub fn finish(&self, id: u64) {
        self.with(|s| s.jobs.get_mut(&id).map(|j| j.running = false));
    }

    /// Adds `source` to `target`'s job token allowlist.
    pub fn allow(&self, target: &str, source: &str) {
        self.with(|s| s.allowed.push((target.into(), source.into())));
    }

    /// The archive job `id` uploaded, if any.
    pub fn artifact(&self, id: u64) -> Option<StoredArtifact> {
        self.with(|s| s.artifacts.get(&id).cloned())
    }

    /// Stores an archive for job `id` as if it had uploaded it.
    pub fn put_artifact(&self, id: u64, bytes: Vec<u8>) {
        let stored = StoredArtifact {
            bytes,
            filename: "artifacts.zip".into(),
            artifact_format: "zip".into(),
            artifact_type: "archive".into(),
            expire_in: None,
        };
        self.with(|s| s.artifacts.insert(id, stored));
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.with(|s| s.seen.clone())
    }

    /// What `git http-backend` wrote to its standard error, every run.
    pub fn backend_errors(&self) -> String {
        self.with(|s| s.backend_errors.clone())
    }
}

/// Letters and digits from the system's random source.
fn random_text(len: usize) -> String {
    use ring::rand::SecureRandom;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut bytes = vec![0u8; len];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("random bytes");
    bytes
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect()
}

async fn handle(
    state: Arc<Mutex<State>>,
    repos: PathBuf,
    req: Request<Incoming>,
) -> Result<Answer, Infallible> {
    let mut seen = seen_of(&req);
    let path = req.uri().path().to_string();
    let answer = if path.starts_with("/api/v4/jobs/") {
        artifacts::api(&state, req).await
    } else if path.starts_with(artifacts::OBJECT_STORAGE) {
        artifacts::object_storage(&state, &req)
    } else if path.contains(".git/") {
        git_http::serve(&state, &repos, req).await
    } else {
        text(404, "text/plain", "Not Found")
    };
    seen.status = answer.status().as_u16();
    state.lock().unwrap().seen.push(seen);
    Ok(answer)
}

fn seen_of<B>(req: &Request<B>) -> Seen {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    let secret = ["token", "job_token", "private_token", "X-Signature"];
    let query = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if secret.contains(&k) => format!("{k}=[REDACTED]"),
            _ => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&");
    Seen {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        query,
        job_token: req.headers().contains_key("job-token"),
        basic_user: header("authorization")
            .and_then(|a| basic_auth(&a))
            .map(|(u, _)| u),
        content_encoding: header("content-encoding"),
        git_protocol: header("git-protocol"),
        status: 0,
    }
}

/// `(user, password)` of a basic `Authorization` header.
fn basic_auth(header: &str) -> Option<(String, String)> {
    use base64::Engine;
    let encoded = header.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.into(), password.into()))
}

fn text(status: u16, content_type: &str, body: &str) -> Answer {
    bytes(status, content_type, Bytes::from(body.to_string()))
}

fn bytes(status: u16, content_type: &str, body: Bytes) -> Answer {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body).map_err(|never| match never {}).boxed())
        .expect("a response")
}

/// A GitLab API error body: `{"message":"…"}` (Grape's `render_api_error!`).
fn api_error(status: u16, message: &str) -> Answer {
    let body = serde_json::json!({ "message": message }).to_string();
    text(status, "application/json", &body)
}

fn repo_exists(repos: &Path, project: &str) -> bool {
    repos.join(format!("{project}.git")).join("HEAD").exists()
}
