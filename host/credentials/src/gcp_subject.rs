//! Where an `external_account` configuration (workload identity federation) gets its subject
//! token, in every form gcloud writes: a file, a URL (Azure's IMDS, a metadata server), an
//! executable (a pluggable source), or AWS (a GetCallerIdentity request signed with the
//! host's AWS keys, which is how AWS workloads federate). The shapes follow Google's
//! reference (<https://google.aip.dev/auth/4117>) and google-auth-library-python
//! (`identity_pool.py`, `pluggable.py`, `aws.py`).
//!
//! Must not know: the STS exchange or impersonation (`gcp.rs` does them with the token).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use super::{Secret, SecretSource};
use crate::oauth::Mint;

/// `credential_source` of an `external_account` configuration.
#[derive(Debug, Deserialize)]
pub(crate) struct CredentialSource {
    #[serde(default)]
    file: Option<PathBuf>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    format: Option<SourceFormat>,
    #[serde(default)]
    executable: Option<Executable>,
    /// `aws1` for the AWS form.
    #[serde(default)]
    environment_id: Option<String>,
    #[serde(default)]
    region_url: Option<String>,
    #[serde(default)]
    regional_cred_verification_url: Option<String>,
    #[serde(default)]
    imdsv2_session_token_url: Option<String>,
}

/// `{"type": "text"}` (the default) or `{"type": "json", "subject_token_field_name": "..."}`.
#[derive(Debug, Deserialize)]
struct SourceFormat {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    subject_token_field_name: Option<String>,
}

/// `{"command": "...", "timeout_millis": 30000, "output_file": "..."}`.
#[derive(Debug, Deserialize)]
struct Executable {
    command: String,
    #[serde(default)]
    timeout_millis: Option<u64>,
    #[serde(default)]
    output_file: Option<PathBuf>,
}

/// What an executable prints (or leaves in its output file).
#[derive(Debug, Deserialize)]
struct ExecutableAnswer {
    version: u32,
    success: bool,
    #[serde(default)]
    token_type: Option<String>,
    #[serde(default)]
    id_token: Option<Secret>,
    #[serde(default)]
    saml_response: Option<Secret>,
    #[serde(default)]
    expiration_time: Option<u64>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// What the exchange needs to know of the configuration besides the source.
pub(crate) struct Federation<'a> {
    pub audience: &'a str,
    pub subject_token_type: &'a str,
    pub impersonated: Option<&'a str>,
}

/// The environment variable that must say `1` before an executable source runs.
const ALLOW_EXECUTABLES: &str = "GOOGLE_EXTERNAL_ACCOUNT_ALLOW_EXECUTABLES";

impl CredentialSource {
    /// The subject token, from whichever source the configuration names.
    pub(crate) async fn subject_token(
        &self,
        credential: &str,
        client: &reqwest::Client,
        federation: &Federation<'_>,
    ) -> Result<Secret, Mint> {
        let failed = |detail: String| Mint::failed(credential, detail);
        if self.environment_id.is_some() {
            return self.aws(credential, client, federation).await;
        }
        if let Some(executable) = &self.executable {
            return executable.run(credential, federation).await;
        }
        let (raw, from) = match (&self.file, &self.url) {
            (Some(file), None) => (
                SecretSource::File(file.clone())
                    .resolve(credential)
                    .map_err(Mint::Failed)?,
                file.display().to_string(),
            ),
            (None, Some(url)) => (self.fetch_url(credential, client, url).await?, url.clone()),
            _ => {
                return Err(failed(
                    "credential_source must have exactly one of file, url, executable or environment_id"
                        .into(),
                ));
            }
        };
        match &self.format {
            Some(f) if f.kind == "json" => {
                let field = f
                    .subject_token_field_name
                    .as_deref()
                    .unwrap_or("access_token");
                let doc: serde_json::Value = serde_json::from_str(raw.expose())
                    .map_err(|_| failed(format!("the subject token from {from} is not JSON")))?;
                let token = doc.get(field).and_then(|v| v.as_str()).ok_or_else(|| {
                    failed(format!("the subject token from {from} has no {field:?}"))
                })?;
                Ok(Secret::new(token))
            }
            _ => Ok(raw),
        }
    }

    /// A URL source: a GET with the configured headers, answered 200.
    async fn fetch_url(
        &self,
        credential: &str,
        client: &reqwest::Client,
        url: &str,
    ) -> Result<Secret, Mint> {
        let mut request = client.get(url);
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        let body = text_of(request, url)
            .await
            .map_err(|e| Mint::failed(credential, format!("the subject token URL: {e}")))?;
        Ok(Secret::new(body.trim()))
    }

    /// The AWS form: a GetCallerIdentity request to the regional STS, signed with the host's
    /// AWS keys and bound to the audience, serialized as the subject token.
    async fn aws(
        &self,
        credential: &str,
        client: &reqwest::Client,
        federation: &Federation<'_>,
    ) -> Result<Secret, Mint> {
        let failed = |detail: String| Mint::failed(credential, detail);
        match self.environment_id.as_deref() {
            Some("aws1") => {}
            other => {
                return Err(failed(format!(
                    "environment_id {other:?}: only aws1 is supported"
                )));
            }
        }
        let verify = self
            .regional_cred_verification_url
            .as_deref()
            .ok_or_else(|| {
                failed("the AWS credential_source lacks regional_cred_verification_url".into())
            })?;
        let imds_token = match &self.imdsv2_session_token_url {
            Some(url) => Some(imds_session(client, url).await.map_err(&failed)?),
            None => None,
        };
        let region = self
            .aws_region(client, imds_token.as_deref())
            .await
            .map_err(&failed)?;
        let keys = self
            .aws_keys(client, imds_token.as_deref())
            .await
            .map_err(&failed)?;
        let url = verify.replace("{region}", &region);
        let host = url
            .parse::<http::Uri>()
            .ok()
            .and_then(|u| u.host().map(str::to_string))
            .ok_or_else(|| {
                failed(format!(
                    "regional_cred_verification_url {url:?} has no host"
                ))
            })?;
        let mut request = http::Request::post(&url)
            .header(http::header::HOST, &host)
            .header("x-goog-cloud-target-resource", federation.audience)
            .body(())
            .map_err(|e| failed(e.to_string()))?;
        super::sign_sigv4(
            &mut request,
            b"",
            "sts",
            &region,
            &keys.0,
            &keys.1,
            keys.2.as_ref(),
        )
        .map_err(|e| failed(format!("signing GetCallerIdentity: {e}")))?;
        let mut headers: Vec<(String, String)> = request
            .headers()
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect();
        headers.sort();
        let serialized = serde_json::json!({
            "headers": headers
                .iter()
                .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
                .collect::<Vec<_>>(),
            "method": "POST",
            "url": url,
        });
        Ok(Secret::new(
            crate::oauth::form_value(&serialized.to_string()).as_str(),
        ))
    }

    /// The AWS region: the environment's, else the metadata server's zone less its letter.
    async fn aws_region(
        &self,
        client: &reqwest::Client,
        imds_token: Option<&str>,
    ) -> Result<String, String> {
        if let Some(region) = env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION")) {
            return Ok(region);
        }
        let url = self
            .region_url
            .as_deref()
            .ok_or("no AWS_REGION and no region_url in the AWS credential_source")?;
        let zone = imds_get(client, url, imds_token).await?;
        // The zone (us-east-1b) without its letter.
        let mut region = zone.trim().to_string();
        region.pop();
        Ok(region)
    }

    /// AWS keys: the environment's, else the role's from the metadata server at `url`.
    async fn aws_keys(
        &self,
        client: &reqwest::Client,
        imds_token: Option<&str>,
    ) -> Result<(Secret, Secret, Option<Secret>), String> {
        if let (Some(id), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            return Ok((
                Secret::new(id),
                Secret::new(secret),
                env("AWS_SESSION_TOKEN").map(Secret::new),
            ));
        }
        let url = self
            .url
            .as_deref()
            .ok_or("no AWS keys in the environment and no url in the AWS credential_source")?;
        let role = imds_get(client, url, imds_token).await?;
        let role = role.lines().next().unwrap_or_default().trim().to_string();
        let keys = imds_get(
            client,
            &format!("{}/{role}", url.trim_end_matches('/')),
            imds_token,
        )
        .await?;
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct RoleKeys {
            access_key_id: Secret,
            secret_access_key: Secret,
            #[serde(default)]
            token: Option<Secret>,
        }
        let keys: RoleKeys = serde_json::from_str(&keys).map_err(|_| {
            format!("the metadata server's keys at {url}/{role} are not the expected JSON")
        })?;
        Ok((keys.access_key_id, keys.secret_access_key, keys.token))
    }
}

impl Executable {
    /// Runs the command (only when `GOOGLE_EXTERNAL_ACCOUNT_ALLOW_EXECUTABLES=1`), or takes an
    /// unexpired answer from its output file.
    async fn run(&self, credential: &str, federation: &Federation<'_>) -> Result<Secret, Mint> {
        let failed = |detail: String| Mint::failed(credential, detail);
        if env(ALLOW_EXECUTABLES).as_deref() != Some("1") {
            return Err(failed(format!(
                "executable-sourced credentials run only with {ALLOW_EXECUTABLES}=1 in flotilla's environment"
            )));
        }
        let timeout = Duration::from_millis(self.timeout_millis.unwrap_or(30_000));
        if !(Duration::from_secs(5)..=Duration::from_secs(120)).contains(&timeout) {
            return Err(failed(
                "executable.timeout_millis must be between 5000 and 120000".into(),
            ));
        }
        if let Some(file) = &self.output_file
            && let Ok(text) = std::fs::read_to_string(file)
            && let Ok(answer) = serde_json::from_str::<ExecutableAnswer>(&text)
            && answer.success
            && answer.expiration_time.is_some_and(|t| t > now_secs())
        {
            return token_of(answer, federation).map_err(failed);
        }
        let mut words = self.command.split_whitespace();
        let program = words
            .next()
            .ok_or_else(|| failed("executable.command is empty".into()))?
            .to_string();
        let args: Vec<String> = words.map(str::to_string).collect();
        let mut command = std::process::Command::new(&program);
        command
            .args(&args)
            .env("GOOGLE_EXTERNAL_ACCOUNT_AUDIENCE", federation.audience)
            .env(
                "GOOGLE_EXTERNAL_ACCOUNT_TOKEN_TYPE",
                federation.subject_token_type,
            )
            .env("GOOGLE_EXTERNAL_ACCOUNT_INTERACTIVE", "0")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        if let Some(email) = federation.impersonated {
            command.env("GOOGLE_EXTERNAL_ACCOUNT_IMPERSONATED_EMAIL", email);
        }
        if let Some(file) = &self.output_file {
            command.env("GOOGLE_EXTERNAL_ACCOUNT_OUTPUT_FILE", file);
        }
        let output = tokio::task::spawn_blocking(move || run_bounded(command, timeout))
            .await
            .map_err(|e| failed(format!("the executable's task failed: {e}")))?
            .map_err(|e| failed(format!("executable {program}: {e}")))?;
        let answer: ExecutableAnswer = serde_json::from_slice(&output)
            .map_err(|_| failed(format!("executable {program} printed no valid answer")))?;
        if answer.version > 1 {
            return Err(failed(format!(
                "executable {program} answered version {}; version 1 is supported",
                answer.version
            )));
        }
        if !answer.success {
            return Err(failed(format!(
                "executable {program} failed: {}: {}",
                answer.code.as_deref().unwrap_or("no code"),
                answer.message.as_deref().unwrap_or("no message")
            )));
        }
        if answer.expiration_time.is_some_and(|t| t <= now_secs()) {
            return Err(failed(format!(
                "executable {program} answered an expired token"
            )));
        }
        token_of(answer, federation).map_err(failed)
    }
}

/// The token of a successful executable answer, of the type the configuration expects.
fn token_of(answer: ExecutableAnswer, federation: &Federation<'_>) -> Result<Secret, String> {
    let kind = answer.token_type.unwrap_or_default();
    if kind != federation.subject_token_type {
        return Err(format!(
            "the executable answered a {kind:?} token; the configuration expects {:?}",
            federation.subject_token_type
        ));
    }
    let token = if kind.ends_with(":saml2") {
        answer.saml_response
    } else {
        answer.id_token
    };
    token.ok_or_else(|| format!("the executable's {kind} answer carries no token"))
}

/// Runs `command` to its end within `timeout`; its stdout. A command past its time is killed.
fn run_bounded(mut command: std::process::Command, timeout: Duration) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut child = command.spawn().map_err(|e| e.to_string())?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        // A pipe closed early leaves what was read; the exit status says the rest.
        let _ = stdout.by_ref().take(1 << 20).read_to_end(&mut out);
        out
    });
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if start.elapsed() > timeout {
            // Already gone is fine.
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("did not finish within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = reader
        .join()
        .map_err(|_| "the reader thread failed".to_string())?;
    if !status.success() {
        return Err(format!("exited with {status}"));
    }
    Ok(out)
}

/// IMDSv2's session token (PUT with a TTL).
async fn imds_session(client: &reqwest::Client, url: &str) -> Result<String, String> {
    let request = client
        .put(url)
        .header("X-aws-ec2-metadata-token-ttl-seconds", "300");
    text_of(request, url).await
}

/// A GET of the metadata server, with the session token when there is one.
async fn imds_get(
    client: &reqwest::Client,
    url: &str,
    token: Option<&str>,
) -> Result<String, String> {
    let mut request = client.get(url);
    if let Some(token) = token {
        request = request.header("X-aws-ec2-metadata-token", token);
    }
    text_of(request, url).await
}

/// The text of a 2xx answer to `request` (sent to `url`).
async fn text_of(request: reqwest::RequestBuilder, url: &str) -> Result<String, String> {
    let response = request
        .send()
        .await
        .map_err(|e| format!("{url}: {}", super::aws::without_url(&e)))?;
    if !response.status().is_success() {
        return Err(format!("{url} answered {}", response.status()));
    }
    response
        .text()
        .await
        .map_err(|e| format!("{url}: {}", super::aws::without_url(&e)))
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
