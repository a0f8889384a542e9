//! Registry credentials: flotilla's own store (written by `plugin login`, mode 0600), falling
//! back to the user's Docker `config.json` (`auths` entries; credential helpers are not run).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde_json::{Value, json};
use zeroize::Zeroizing;

use super::OciError;

/// A username and password for one registry; the password never reaches Debug output.
#[derive(Clone)]
pub(crate) struct Basic {
    pub user: String,
    pub password: Zeroizing<String>,
}

impl std::fmt::Debug for Basic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Basic({}, <redacted>)", self.user)
    }
}

/// Where registry credentials are read from and written to.
#[derive(Debug, Clone)]
pub struct AuthStore {
    /// flotilla's store.
    pub own: PathBuf,
    /// Docker's `config.json`, read only.
    pub docker: Option<PathBuf>,
}

fn decode_auth(entry: &Value) -> Option<Basic> {
    if let Some(auth) = entry.get("auth").and_then(Value::as_str) {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .ok()?;
        let text = Zeroizing::new(String::from_utf8(raw).ok()?);
        let (user, password) = text.split_once(':')?;
        return Some(Basic {
            user: user.to_string(),
            password: Zeroizing::new(password.to_string()),
        });
    }
    let user = entry.get("username")?.as_str()?;
    let password = entry.get("password")?.as_str()?;
    Some(Basic {
        user: user.to_string(),
        password: Zeroizing::new(password.to_string()),
    })
}

fn registry_keys(registry: &str) -> [String; 3] {
    [
        registry.to_string(),
        format!("https://{registry}"),
        format!("http://{registry}"),
    ]
}

impl AuthStore {
    /// `$FLOTILLA_CONFIG_HOME/auth.json` (or the platform config dir) and
    /// `$DOCKER_CONFIG/config.json` (or `~/.docker/config.json`).
    pub fn default_paths() -> Self {
        let own = std::env::var_os("FLOTILLA_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| {
                directories::ProjectDirs::from("dev", "flotilla", "flotilla")
                    .map(|d| d.config_dir().to_path_buf())
            })
            .unwrap_or_else(|| PathBuf::from(".flotilla"))
            .join("auth.json");
        let docker = std::env::var_os("DOCKER_CONFIG")
            .map(PathBuf::from)
            .or_else(|| directories::BaseDirs::new().map(|b| b.home_dir().join(".docker")))
            .map(|d| d.join("config.json"));
        AuthStore { own, docker }
    }

    fn read(path: &Path) -> Result<Value, OciError> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| OciError::local(path, format!("not valid JSON: {e}"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(json!({})),
            Err(e) => Err(OciError::local(path, e)),
        }
    }

    /// Credentials for `registry`, own store first; `None` means anonymous.
    pub(crate) fn lookup(&self, registry: &str) -> Result<Option<Basic>, OciError> {
        for path in std::iter::once(&self.own).chain(self.docker.iter()) {
            let v = Self::read(path)?;
            for key in registry_keys(registry) {
                if let Some(found) = v.pointer(&format!("/auths/{}", key.replace('/', "~1")))
                    && let Some(b) = decode_auth(found)
                {
                    return Ok(Some(b));
                }
            }
        }
        Ok(None)
    }

    fn write_own(&self, v: &Value) -> Result<(), OciError> {
        let dir = self.own.parent().unwrap_or(Path::new("."));
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            builder.mode(0o700);
        }
        builder.create(dir).map_err(|e| OciError::local(dir, e))?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| OciError::local(dir, e))?;
        let bytes = Zeroizing::new(
            serde_json::to_vec_pretty(v).map_err(|e| OciError::local(&self.own, e))?,
        );
        use std::io::Write;
        tmp.write_all(&bytes)
            .map_err(|e| OciError::local(&self.own, e))?;
        // NamedTempFile is created 0600 on unix.
        tmp.persist(&self.own)
            .map_err(|e| OciError::local(&self.own, e.error))?;
        Ok(())
    }

    /// Saves credentials for `registry` in flotilla's store.
    pub fn save(&self, registry: &str, user: &str, password: &str) -> Result<(), OciError> {
        let mut v = Self::read(&self.own)?;
        let auth = Zeroizing::new(
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")),
        );
        let auths = v
            .as_object_mut()
            .map(|o| o.entry("auths").or_insert_with(|| json!({})));
        match auths.and_then(Value::as_object_mut) {
            Some(auths) => {
                auths.insert(registry.to_string(), json!({ "auth": auth.as_str() }));
            }
            None => {
                return Err(OciError::local(
                    &self.own,
                    "unexpected shape (expected {\"auths\": {...}})",
                ));
            }
        }
        self.write_own(&v)
    }

    /// Removes `registry` from flotilla's store; returns whether it was there.
    pub fn remove(&self, registry: &str) -> Result<bool, OciError> {
        let mut v = Self::read(&self.own)?;
        let removed = v
            .get_mut("auths")
            .and_then(Value::as_object_mut)
            .map(|a| {
                registry_keys(registry)
                    .iter()
                    .filter(|k| a.remove(k.as_str()).is_some())
                    .count()
                    > 0
            })
            .unwrap_or(false);
        if removed {
            self.write_own(&v)?;
        }
        Ok(removed)
    }
}

fn parse_challenge(header: &str) -> (String, BTreeMap<String, String>) {
    let (scheme, rest) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
    let mut params = BTreeMap::new();
    let mut rest = rest.trim();
    while !rest.is_empty() {
        let Some((k, after)) = rest.split_once('=') else {
            break;
        };
        let (value, tail) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.split_once('"') {
                Some((v, t)) => (v, t),
                None => (quoted, ""),
            }
        } else {
            after.split_once(',').unwrap_or((after, ""))
        };
        params.insert(k.trim().to_ascii_lowercase(), value.to_string());
        rest = tail.trim_start_matches([',', ' ']);
    }
    (scheme.to_ascii_lowercase(), params)
}

/// Verifies credentials the way `docker login` does: `GET /v2/`, then Basic or a token from the
/// realm the registry names. Ok(false) means the registry needs no credentials at all.
pub async fn login_probe(
    http: &reqwest::Client,
    base: &str,
    registry: &str,
    user: &str,
    password: &str,
) -> Result<bool, OciError> {
    let probe = LoginProbe {
        http,
        v2: format!("{base}/v2/"),
        registry,
        user,
        password,
    };
    let first = probe
        .http
        .get(&probe.v2)
        .send()
        .await
        .map_err(|e| probe.unreachable(e))?;
    if first.status().is_success() {
        return Ok(false);
    }
    if first.status() != reqwest::StatusCode::UNAUTHORIZED {
        return Err(probe.fail(format!("GET /v2/ answered {}", first.status())));
    }
    let challenge = first
        .headers()
        .get(reqwest::header::WWW_AUTHENTICATE)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_string();
    let (scheme, params) = parse_challenge(&challenge);
    match scheme.as_str() {
        "basic" => probe.basic().await,
        "bearer" => probe.bearer(&params).await,
        _ => Err(probe.fail(format!(
            "unsupported authentication challenge {challenge:?}"
        ))),
    }
}

/// One login attempt against one registry.
struct LoginProbe<'a> {
    http: &'a reqwest::Client,
    v2: String,
    registry: &'a str,
    user: &'a str,
    password: &'a str,
}

impl LoginProbe<'_> {
    fn fail(&self, why: String) -> OciError {
        OciError::Login {
            registry: self.registry.to_string(),
            why,
        }
    }

    fn unreachable(&self, e: reqwest::Error) -> OciError {
        OciError::Unreachable {
            registry: self.registry.to_string(),
            why: crate::http::describe_reqwest(&e),
        }
    }

    fn wrong(&self) -> OciError {
        self.fail("the registry rejected the username or password (401); nothing was saved".into())
    }

    async fn basic(&self) -> Result<bool, OciError> {
        let r = self
            .http
            .get(&self.v2)
            .basic_auth(self.user, Some(self.password))
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        if r.status().is_success() {
            Ok(true)
        } else if r.status() == reqwest::StatusCode::UNAUTHORIZED {
            Err(self.wrong())
        } else {
            Err(self.fail(format!("GET /v2/ with credentials answered {}", r.status())))
        }
    }

    async fn bearer(&self, params: &BTreeMap<String, String>) -> Result<bool, OciError> {
        let token = self.token(params).await?;
        let check = self
            .http
            .get(&self.v2)
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        if check.status().is_success() {
            Ok(true)
        } else {
            Err(self.wrong())
        }
    }

    /// A token from the realm of a Bearer challenge, asked for with the user's password.
    async fn token(&self, params: &BTreeMap<String, String>) -> Result<String, OciError> {
        let realm = params
            .get("realm")
            .ok_or_else(|| self.fail("Bearer challenge without a realm".to_string()))?;
        let mut url = url::Url::parse(realm)
            .map_err(|e| self.fail(format!("token realm {realm:?} is not a URL: {e}")))?;
        {
            let mut q = url.query_pairs_mut();
            if let Some(service) = params.get("service") {
                q.append_pair("service", service);
            }
            q.append_pair("account", self.user);
        }
        let r = self
            .http
            .get(url.clone())
            .basic_auth(self.user, Some(self.password))
            .send()
            .await
            .map_err(|e| OciError::Unreachable {
                registry: format!(
                    "{} (token service {})",
                    self.registry,
                    url.origin().ascii_serialization()
                ),
                why: crate::http::describe_reqwest(&e),
            })?;
        if r.status() == reqwest::StatusCode::UNAUTHORIZED
            || r.status() == reqwest::StatusCode::FORBIDDEN
        {
            return Err(self.wrong());
        }
        if !r.status().is_success() {
            return Err(self.fail(format!("token service answered {}", r.status())));
        }
        let body: Value = r
            .json()
            .await
            .map_err(|e| self.fail(format!("token service answer is not JSON: {e}")))?;
        body.get("token")
            .or_else(|| body.get("access_token"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| self.fail("token service answer holds no token".to_string()))
    }
}

/// Reads a single password line from stdin (for `--password-stdin`-style logins).
pub fn read_password(mut input: impl std::io::BufRead) -> Result<Zeroizing<String>, String> {
    let mut line = Zeroizing::new(String::new());
    input
        .read_line(&mut line)
        .map_err(|e| format!("cannot read the password from stdin: {e}"))?;
    let trimmed = Zeroizing::new(line.trim_end_matches(['\r', '\n']).to_string());
    if trimmed.is_empty() {
        return Err("no password on stdin; pipe it in, e.g. `echo \"$PASS\" | flotilla plugin login REGISTRY -u USER`".to_string());
    }
    Ok(trimmed)
}
