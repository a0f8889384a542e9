//! The stand-in GitLab answers git and the jobs artifacts API as GitLab does for CI jobs:
//! driven with Debian's git and curl on loopback, as the helper container would.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

use flotilla_peers::gitlab::{GIT, GitLab, Options, WorkTree};

const PROJECT: &str = "group/app";

async fn gitlab(options: Options) -> GitLab {
    GitLab::start(Ipv4Addr::LOCALHOST.into(), options).await
}

/// A project with two commits on `main`.
fn publish_app(gitlab: &GitLab) -> (String, String) {
    let work = WorkTree::new();
    work.write("README", b"one\n");
    let first = work.commit("one");
    work.write("README", b"two\n");
    let second = work.commit("two");
    gitlab.publish(PROJECT, &work);
    (first, second)
}

/// `git clone` with a job token, as a job's fetch authenticates; the output on failure.
fn clone(gitlab: &GitLab, project: &str, token: &str, into: &Path) -> Result<(), String> {
    let url = gitlab
        .url
        .replace("http://", &format!("http://gitlab-ci-token:{token}@"));
    let out = Command::new(GIT)
        .args(["clone", "--quiet", &format!("{url}/{project}.git")])
        .arg(into)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .expect("git clone");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request with curl (no redirects followed).
fn curl(args: &[&str]) -> Reply {
    let out = Command::new("curl")
        .args(["-sS", "-i", "--http1.1"])
        .args(args)
        .output()
        .expect("curl");
    assert!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let raw = out.stdout;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Reply {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_token_clones_its_own_project() {
    let gitlab = gitlab(Options::default()).await;
    let (_, tip) = publish_app(&gitlab);
    let job = gitlab.job(PROJECT);
    let dir = tempfile::tempdir().expect("dir");
    clone(&gitlab, PROJECT, &job.token, &dir.path().join("app")).expect("the clone");
    let head = flotilla_peers::gitlab::git(&dir.path().join("app"), &["rev-parse", "HEAD"]);
    assert_eq!(head.trim(), tip);
    let seen = gitlab.seen();
    assert!(
        seen.iter()
            .all(|s| s.status != 200 || s.basic_user.as_deref() == Some("gitlab-ci-token"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_token_is_challenged_with_the_gitlab_realm() {
    let gitlab = gitlab(Options::default()).await;
    publish_app(&gitlab);
    gitlab.job(PROJECT);
    let url = format!(
        "{}/{PROJECT}.git/info/refs?service=git-upload-pack",
        gitlab.url
    );
    for auth in [vec![], vec!["-u", "gitlab-ci-token:glcbt-wrong"]] {
        let reply = curl(&[auth, vec![url.as_str()]].concat());
        assert_eq!(reply.status, 401);
        assert_eq!(
            reply.header("www-authenticate"),
            Some("Basic realm=\"GitLab\"")
        );
    }
    let dir = tempfile::tempdir().expect("dir");
    let refused = clone(&gitlab, PROJECT, "glcbt-wrong", &dir.path().join("app"));
    assert!(refused.is_err(), "a wrong token cloned");
}

#[tokio::test(flavor = "multi_thread")]
async fn another_projects_job_reads_only_after_the_allowlist_names_it() {
    let gitlab = gitlab(Options::default()).await;
    publish_app(&gitlab);
    let other = gitlab.job("group/other");
    let dir = tempfile::tempdir().expect("dir");
    let refused =
        clone(&gitlab, PROJECT, &other.token, &dir.path().join("a")).expect_err("refused");
    assert!(refused.contains("403"), "{refused}");
    gitlab.allow(PROJECT, "group/other");
    clone(&gitlab, PROJECT, &other.token, &dir.path().join("b")).expect("allowed now");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_finished_jobs_token_no_longer_clones() {
    let gitlab = gitlab(Options::default()).await;
    publish_app(&gitlab);
    let job = gitlab.job(PROJECT);
    gitlab.finish(job.id);
    let dir = tempfile::tempdir().expect("dir");
    assert!(clone(&gitlab, PROJECT, &job.token, &dir.path().join("app")).is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_token_may_not_push() {
    let gitlab = gitlab(Options::default()).await;
    publish_app(&gitlab);
    let job = gitlab.job(PROJECT);
    let url = format!(
        "{}/{PROJECT}.git/info/refs?service=git-receive-pack",
        gitlab.url
    );
    let token = format!("gitlab-ci-token:{}", job.token);
    let reply = curl(&["-u", &token, &url]);
    assert_eq!(reply.status, 403);
}

/// Wants for 80 tags make git gzip its fetch request; the backend inflates it.
#[tokio::test(flavor = "multi_thread")]
async fn a_gzipped_fetch_negotiation_is_served() {
    let gitlab = gitlab(Options::default()).await;
    let work = WorkTree::new();
    for n in 0..80 {
        work.write("n", n.to_string().as_bytes());
        work.commit(&format!("c{n}"));
        work.tag(&format!("v{n}"));
    }
    gitlab.publish(PROJECT, &work);
    let job = gitlab.job(PROJECT);
    let dir = tempfile::tempdir().expect("dir");
    clone(&gitlab, PROJECT, &job.token, &dir.path().join("app")).expect("the clone");
    let tags = flotilla_peers::gitlab::git(&dir.path().join("app"), &["tag"]);
    assert_eq!(tags.lines().count(), 80);
    let gzipped = gitlab
        .seen()
        .iter()
        .any(|s| s.content_encoding.as_deref() == Some("gzip") && s.status == 200);
    assert!(gzipped, "no gzipped request was seen: {:?}", gitlab.seen());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_large_file_streams_through_intact() {
    let gitlab = gitlab(Options::default()).await;
    let work = WorkTree::new();
    let large: Vec<u8> = (0..12u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    work.write("large.bin", &large);
    work.commit("large");
    gitlab.publish(PROJECT, &work);
    let job = gitlab.job(PROJECT);
    let dir = tempfile::tempdir().expect("dir");
    clone(&gitlab, PROJECT, &job.token, &dir.path().join("app")).expect("the clone");
    let got = std::fs::read(dir.path().join("app/large.bin")).expect("the file");
    assert!(got == large, "the large file changed on the way");
}

fn upload(gitlab: &GitLab, id: u64, token: &str, file: &Path) -> Reply {
    let url = format!(
        "{}/api/v4/jobs/{id}/artifacts?artifact_format=zip&artifact_type=archive&expire_in=1+week",
        gitlab.url
    );
    let header = format!("JOB-TOKEN: {token}");
    let form = format!("file=@{};filename=artifacts.zip", file.display());
    curl(&["-H", &header, "-F", &form, &url])
}

fn archive(dir: &Path, bytes: &[u8]) -> std::path::PathBuf {
    let file = dir.join("artifacts.zip");
    std::fs::write(&file, bytes).expect("the archive");
    file
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upload_with_the_jobs_own_token_is_stored() {
    let gitlab = gitlab(Options::default()).await;
    let job = gitlab.job(PROJECT);
    let dir = tempfile::tempdir().expect("dir");
    let file = archive(dir.path(), b"PK\x03\x04 an archive");
    let reply = upload(&gitlab, job.id, &job.token, &file);
    assert_eq!(
        reply.status,
        201,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let stored = gitlab.artifact(job.id).expect("stored");
    assert_eq!(stored.bytes, b"PK\x03\x04 an archive");
    assert_eq!(
        (
            stored.filename.as_str(),
            stored.artifact_type.as_str(),
            stored.expire_in.as_deref()
        ),
        ("artifacts.zip", "archive", Some("1 week"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn uploads_with_a_wrong_token_or_too_large_are_refused() {
    let gitlab = gitlab(Options {
        max_artifact_size: 1000,
        ..Options::default()
    })
    .await;
    let job = gitlab.job(PROJECT);
    let other = gitlab.job(PROJECT);
    let dir = tempfile::tempdir().expect("dir");
    let small = archive(dir.path(), b"PK small");
    assert_eq!(upload(&gitlab, job.id, &other.token, &small).status, 403);
    assert_eq!(upload(&gitlab, job.id, "glcbt-unknown", &small).status, 403);
    let large = archive(dir.path(), &[7u8; 5000]);
    let reply = upload(&gitlab, job.id, &job.token, &large);
    assert_eq!(reply.status, 413);
    assert!(String::from_utf8_lossy(&reply.body).contains("maximum size limit"));
    assert!(gitlab.artifact(job.id).is_none());
}

fn download(gitlab: &GitLab, id: u64, token: &str, query: &str) -> Reply {
    let url = format!("{}/api/v4/jobs/{id}/artifacts{query}", gitlab.url);
    curl(&["-H", &format!("JOB-TOKEN: {token}"), &url])
}

#[tokio::test(flavor = "multi_thread")]
async fn a_later_job_of_the_project_downloads_an_artifact() {
    let gitlab = gitlab(Options::default()).await;
    let build = gitlab.job(PROJECT);
    gitlab.put_artifact(build.id, b"PK the build".to_vec());
    gitlab.finish(build.id);
    let test = gitlab.job(PROJECT);
    let reply = download(&gitlab, build.id, &test.token, "?direct_download=true");
    assert_eq!(
        (reply.status, reply.body.as_slice()),
        (200, &b"PK the build"[..])
    );
    let stranger = gitlab.job("group/other");
    assert_eq!(download(&gitlab, build.id, &stranger.token, "").status, 403);
    assert_eq!(download(&gitlab, build.id, "glcbt-unknown", "").status, 401);
    assert_eq!(download(&gitlab, test.id, &test.token, "").status, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_direct_download_is_redirected_to_object_storage_that_needs_no_job_token() {
    let gitlab = gitlab(Options {
        object_storage: true,
        ..Options::default()
    })
    .await;
    let build = gitlab.job(PROJECT);
    gitlab.put_artifact(build.id, b"PK stored".to_vec());
    let test = gitlab.job(PROJECT);
    let proxied = download(&gitlab, build.id, &test.token, "");
    assert_eq!(
        proxied.status, 200,
        "without direct_download GitLab serves the file"
    );
    let reply = download(&gitlab, build.id, &test.token, "?direct_download=true");
    assert_eq!(reply.status, 302);
    let location = reply.header("location").expect("a location").to_string();
    assert!(location.contains("/object-storage/"), "{location}");
    let stored = curl(&[&location]);
    assert_eq!(
        (stored.status, stored.body.as_slice()),
        (200, &b"PK stored"[..])
    );
    let tampered = location.replace("X-Signature=", "X-Signature=00");
    assert_eq!(curl(&[&tampered]).status, 403);
    let unsigned = location.split('?').next().expect("a path");
    assert_eq!(
        curl(&["-H", &format!("JOB-TOKEN: {}", test.token), unsigned]).status,
        403
    );
    let seen = gitlab.seen();
    let storage: Vec<_> = seen
        .iter()
        .filter(|s| s.path.starts_with("/object-storage/"))
        .collect();
    assert!(
        !storage[0].job_token,
        "the signed URL was fetched without JOB-TOKEN"
    );
    assert!(
        storage[0].query.contains("X-Signature=[REDACTED]"),
        "{:?}",
        storage[0]
    );
}
