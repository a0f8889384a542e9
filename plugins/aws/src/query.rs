//! The AWS Query protocol over wasi:http. Requests name the pool credential and the service;
//! the host signs them with SigV4, so this code never sees a key.

use wstd::http::{Body, Client, Request};

use crate::flotilla::provider::types::{Error, Throttle};

/// Where to send calls, and as whom.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub autoscaling: String,
    pub ec2: String,
    pub region: String,
    pub credential: String,
}

/// A parsed XML answer, owned.
pub struct Xml(pub String);

impl Xml {
    pub fn doc(&self) -> Result<roxmltree::Document<'_>, Error> {
        roxmltree::Document::parse(&self.0)
            .map_err(|e| Error::Other(format!("unparseable AWS response: {e}")))
    }
}

/// Text of the first descendant element called `name`.
pub fn text<'a>(node: roxmltree::Node<'a, 'a>, name: &str) -> Option<&'a str> {
    node.descendants()
        .find(|n| n.has_tag_name(name))
        .and_then(|n| n.text())
}

/// Text of a direct child element called `name`.
pub fn child<'a>(node: roxmltree::Node<'a, 'a>, name: &str) -> Option<&'a str> {
    node.children()
        .find(|n| n.has_tag_name(name))
        .and_then(|n| n.text())
}

/// Direct child element called `name`.
pub fn child_node<'a>(
    node: roxmltree::Node<'a, 'a>,
    name: &str,
) -> Option<roxmltree::Node<'a, 'a>> {
    node.children().find(|n| n.has_tag_name(name))
}

fn classify(action: &str, status: u16, body: &str) -> Error {
    let (code, message) = match roxmltree::Document::parse(body) {
        Ok(doc) => (
            text(doc.root(), "Code").unwrap_or("").to_string(),
            text(doc.root(), "Message").unwrap_or("").to_string(),
        ),
        Err(_) => (String::new(), body.chars().take(200).collect()),
    };
    let what = format!("{action}: {code} (HTTP {status}): {message}");
    match code.as_str() {
        "Throttling" | "ThrottlingException" | "RequestLimitExceeded" => {
            Error::Throttled(Throttle {
                retry_after_seconds: 0,
                message: what,
            })
        }
        "AuthFailure"
        | "SignatureDoesNotMatch"
        | "AccessDenied"
        | "AccessDeniedException"
        | "UnauthorizedOperation"
        | "InvalidClientTokenId"
        | "ExpiredToken"
        | "MissingAuthenticationToken" => Error::Unauthorized(what),
        "ValidationError" | "InvalidParameterValue" | "InvalidParameterCombination" => {
            Error::InvalidConfig(what)
        }
        "LimitExceeded" | "ServiceLinkedRoleFailure" => Error::QuotaExceeded(what),
        "InvalidInstanceID.NotFound" | "InvalidInstanceID.Malformed" => Error::NotFound(what),
        _ if status >= 500 => Error::Transient(what),
        _ if status == 401 || status == 403 => Error::Unauthorized(what),
        _ => Error::Other(what),
    }
}

impl Endpoint {
    /// Calls one Query action on `service` ("autoscaling" or "ec2").
    pub fn call(
        &self,
        service: &str,
        action: &str,
        params: &[(&str, String)],
    ) -> Result<Xml, Error> {
        let (url, version) = match service {
            "ec2" => (&self.ec2, "2016-11-15"),
            _ => (&self.autoscaling, "2011-01-01"),
        };
        let mut form = form_urlencoded::Serializer::new(String::new());
        form.append_pair("Action", action)
            .append_pair("Version", version);
        for (k, v) in params {
            form.append_pair(k, v);
        }
        let body = form.finish();
        let request = Request::post(url.as_str())
            .header(
                "content-type",
                "application/x-www-form-urlencoded; charset=utf-8",
            )
            .header("flotilla-credential", self.credential.as_str())
            .header("flotilla-aws-service", service)
            .header("flotilla-aws-region", self.region.as_str())
            .body(Body::from(body.into_bytes()))
            .map_err(|e| Error::InvalidConfig(format!("{action}: bad request: {e}")))?;
        wstd::runtime::block_on(async {
            let mut response = Client::new()
                .send(request)
                .await
                .map_err(|e| Error::Transient(format!("{action}: {e}")))?;
            let status = response.status().as_u16();
            let text = response
                .body_mut()
                .str_contents()
                .await
                .map_err(|e| Error::Transient(format!("{action}: reading response: {e}")))?
                .to_string();
            if (200..300).contains(&status) {
                Ok(Xml(text))
            } else {
                Err(classify(action, status, &text))
            }
        })
    }
}
