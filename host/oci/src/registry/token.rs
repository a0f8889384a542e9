//! The bearer token of a pull: the registry's challenge, and its token realm's answer read
//! bounded, handed to oci-client for the blob requests.

use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;

use super::Registry;
use super::pull::{MAX_ERROR_BODY, read_limited};
use crate::http::describe_reqwest;
use crate::{OciError, OciRef};

/// The largest answer of a token realm read (a bearer token is a few KiB at most).
const MAX_TOKEN_ANSWER: u64 = 64 * 1024;

impl Registry {
    /// The bearer token to pull from `r`'s repository: the registry's challenge (`GET /v2/`)
    /// and its token realm's answer are read here, bounded (oci-client reads a realm's answer
    /// whole), then handed to oci-client, which keeps it for the blob requests. The realm is
    /// the registry's word, so it must be HTTPS unless the registry itself is reached over
    /// plain HTTP: the account's password never goes in clear to a host the registry names.
    /// `None`: the registry asks for no token (anonymous, or Basic on every request).
    pub(super) async fn pull_token(
        &self,
        client: &oci_client::Client,
        auth: &RegistryAuth,
        r: &OciRef,
    ) -> Result<Option<String>, OciError> {
        let reference = r.client_ref();
        let stored = |token: String| async {
            client
                .auth(
                    &reference,
                    &RegistryAuth::Bearer(token.clone()),
                    oci_client::RegistryOperation::Pull,
                )
                .await
                .map_err(|e| self.map_err(r, false, e))?;
            Ok::<_, OciError>(Some(token))
        };
        if let RegistryAuth::Bearer(token) = auth {
            return stored(token.clone()).await;
        }
        let unreachable = |e: reqwest::Error| OciError::Unreachable {
            registry: r.registry.clone(),
            why: describe_reqwest(&e),
        };
        let base = self.base_url(r)?;
        let http = self.http()?;
        let probe = http
            .get(format!("{base}/v2/"))
            .send()
            .await
            .map_err(unreachable)?;
        let challenge = probe
            .headers()
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(|h| h.to_str().ok())
            .and_then(bearer_challenge);
        // The probe's own body is not needed; at most a bounded part of it is read.
        let _ = read_limited(probe, MAX_ERROR_BODY, "error answer", r).await;
        let Some((realm, service)) = challenge else {
            // No bearer challenge: oci-client keeps the account (Basic) for its own blob
            // requests, as before; it reads no realm for it.
            client
                .auth(&reference, auth, oci_client::RegistryOperation::Pull)
                .await
                .map_err(|e| self.map_err(r, false, e))?;
            return Ok(None);
        };
        let token = self
            .ask_realm(&http, auth, r, &base, (realm, service))
            .await?;
        stored(token).await
    }

    /// The token the registry's realm answers for pulling `r`, with the account's Basic
    /// credentials; a realm over plain HTTP is refused unless the registry is reached so.
    async fn ask_realm(
        &self,
        http: &reqwest::Client,
        auth: &RegistryAuth,
        r: &OciRef,
        base: &str,
        (realm, service): (String, Option<String>),
    ) -> Result<String, OciError> {
        let unreachable = |e: reqwest::Error| OciError::Unreachable {
            registry: r.registry.clone(),
            why: describe_reqwest(&e),
        };
        let realm_url = reqwest::Url::parse(&realm).map_err(|e| OciError::Registry {
            registry: r.registry.clone(),
            reference: r.to_string(),
            why: format!("the token realm {realm:?} is not a URL: {e}"),
        })?;
        if realm_url.scheme() != "https" && !base.starts_with("http://") {
            return Err(OciError::Registry {
                registry: r.registry.clone(),
                reference: r.to_string(),
                why: format!(
                    "the registry names a token realm over {} ({realm}); refusing to send credentials anywhere but HTTPS",
                    realm_url.scheme()
                ),
            });
        }
        let mut query = vec![("scope", format!("repository:{}:pull", r.repository))];
        if let Some(service) = service {
            query.push(("service", service));
        }
        let mut request = http.get(realm_url).query(&query);
        if let RegistryAuth::Basic(user, password) = auth {
            request = request.basic_auth(user, Some(password));
        }
        let answer = request.send().await.map_err(unreachable)?;
        let status = answer.status();
        let body = read_limited(answer, MAX_TOKEN_ANSWER, "token answer", r).await?;
        if !status.is_success() {
            let why = String::from_utf8_lossy(&body).chars().take(300).collect();
            return Err(self.map_err(
                r,
                false,
                OciDistributionError::ServerError {
                    code: if status.as_u16() == 401 || status.as_u16() == 403 {
                        status.as_u16()
                    } else {
                        0
                    },
                    url: realm,
                    message: why,
                },
            ));
        }
        #[derive(serde::Deserialize)]
        struct TokenAnswer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let parsed: TokenAnswer =
            serde_json::from_slice(&body).map_err(|e| OciError::Registry {
                registry: r.registry.clone(),
                reference: r.to_string(),
                why: format!("the token realm's answer is not a token: {e}"),
            })?;
        parsed
            .token
            .or(parsed.access_token)
            .ok_or_else(|| OciError::Registry {
                registry: r.registry.clone(),
                reference: r.to_string(),
                why: "the token realm's answer holds no token".to_string(),
            })
    }
}

/// `realm` and `service` of a `WWW-Authenticate: Bearer ...` challenge (RFC 6750 section 3,
/// as the distribution spec's token authentication uses it); `None` for any other scheme.
fn bearer_challenge(header: &str) -> Option<(String, Option<String>)> {
    let rest = header.trim();
    let (scheme, params) = rest.split_once(char::is_whitespace)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut realm = None;
    let mut service = None;
    let mut rest = params.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let after = after.trim_start();
        let (value, tail) = if let Some(quoted) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, escaped)) = chars.next() {
                            value.push(escaped);
                        }
                    }
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, quoted.get(end?..).unwrap_or(""))
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        match key.as_str() {
            "realm" => realm = Some(value),
            "service" => service = Some(value),
            _ => {}
        }
        rest = tail.trim_start().trim_start_matches(',').trim_start();
    }
    Some((realm?, service))
}

#[cfg(test)]
mod challenge_tests {
    use super::bearer_challenge;

    #[test]
    fn a_bearer_challenge_gives_its_realm_and_service() {
        assert_eq!(
            bearer_challenge(
                r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:a/b:pull""#
            ),
            Some((
                "https://auth.example.com/token".to_string(),
                Some("registry.example.com".to_string())
            ))
        );
        assert_eq!(
            bearer_challenge(r#"bearer service="s", realm="https://r/t\"x""#),
            Some(("https://r/t\"x".to_string(), Some("s".to_string())))
        );
        assert_eq!(bearer_challenge(r#"Basic realm="registry""#), None);
        assert_eq!(bearer_challenge("Bearer service=\"s\""), None);
    }
}
