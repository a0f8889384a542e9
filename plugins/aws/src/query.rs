//! The AWS Query protocol (Auto Scaling, EC2) and the JSON 1.1 protocol (EC2 Instance Connect)
//! over wasi:http. Requests name the pool credential and the service; the host signs them with
//! SigV4, so this code never sees a key.

use flotilla_guest_http::{Method, Request};

use crate::flotilla::provider::types::{Error, Throttle};

/// Where to send calls, and as whom.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub autoscaling: String,
    pub ec2: String,
    pub instance_connect: String,
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
        // Auto Scaling refuses a change while a scaling activity runs, and a change that
        // races another (`ScalingActivityInProgress`, `ResourceContention`): try again soon.
        // <https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_TerminateInstanceInAutoScalingGroup.html#API_TerminateInstanceInAutoScalingGroup_Errors>
        "ScalingActivityInProgress" | "ResourceContention" => Error::Transient(what),
        "InvalidInstanceID.NotFound" | "InvalidInstanceID.Malformed" => Error::NotFound(what),
        _ if status >= 500 => Error::Transient(what),
        _ if status == 401 || status == 403 => Error::Unauthorized(what),
        _ => Error::Other(what),
    }
}

/// Error of a JSON 1.1 service (`{"__type": "...#Code", "Message": "..."}`), classified.
fn classify_json(action: &str, status: u16, body: &str) -> Error {
    let parsed: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let field = |name: &str| parsed.get(name).and_then(serde_json::Value::as_str);
    let code = field("__type")
        .map(|t| t.rsplit('#').next().unwrap_or(t))
        .unwrap_or("")
        .to_string();
    let message = field("Message")
        .or_else(|| field("message"))
        .map_or_else(|| body.chars().take(200).collect(), str::to_string);
    let what = format!("{action}: {code} (HTTP {status}): {message}");
    match code.as_str() {
        "ThrottlingException" => Error::Throttled(Throttle {
            retry_after_seconds: 0,
            message: what,
        }),
        "AuthException"
        | "AccessDeniedException"
        | "UnrecognizedClientException"
        | "InvalidSignatureException"
        | "MissingAuthenticationTokenException" => Error::Unauthorized(what),
        "EC2InstanceNotFoundException" => Error::NotFound(what),
        // Not running yet, or not reachable by the service right now: try again later.
        "EC2InstanceStateInvalidException" | "EC2InstanceUnavailableException" => {
            Error::Transient(what)
        }
        "InvalidArgsException" => Error::InvalidConfig(what),
        _ if status >= 500 => Error::Transient(what),
        _ if status == 401 || status == 403 => Error::Unauthorized(what),
        _ => Error::Other(what),
    }
}

impl Endpoint {
    /// EC2 Instance Connect `SendSSHPublicKey`: lets `key` log in as `user` on `instance` for
    /// 60 seconds.
    /// <https://docs.aws.amazon.com/ec2-instance-connect/latest/APIReference/API_SendSSHPublicKey.html>
    pub fn send_ssh_public_key(
        &self,
        instance: &str,
        user: &str,
        key: &str,
        zone: Option<&str>,
    ) -> Result<(), Error> {
        const ACTION: &str = "SendSSHPublicKey";
        let mut body = serde_json::Map::new();
        body.insert("InstanceId".into(), instance.into());
        body.insert("InstanceOSUser".into(), user.into());
        body.insert("SSHPublicKey".into(), key.into());
        if let Some(zone) = zone {
            body.insert("AvailabilityZone".into(), zone.into());
        }
        let body = serde_json::Value::Object(body).to_string();
        let (status, text) = send(
            ACTION,
            &Request {
                method: Method::Post,
                url: &self.instance_connect,
                headers: &[
                    ("content-type", "application/x-amz-json-1.1"),
                    (
                        "x-amz-target",
                        "AWSEC2InstanceConnectService.SendSSHPublicKey",
                    ),
                    ("flotilla-credential", &self.credential),
                    ("flotilla-aws-service", "ec2-instance-connect"),
                    ("flotilla-aws-region", &self.region),
                ],
                body: Some(body.as_bytes()),
            },
        )?;
        if !(200..300).contains(&status) {
            return Err(classify_json(ACTION, status, &text));
        }
        let answer: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::Other(format!("{ACTION}: unparseable answer: {e}")))?;
        if answer.get("Success") != Some(&serde_json::Value::Bool(true)) {
            return Err(Error::Other(format!("{ACTION}: not successful: {text}")));
        }
        Ok(())
    }

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
        let (status, text) = send(
            action,
            &Request {
                method: Method::Post,
                url,
                headers: &[
                    (
                        "content-type",
                        "application/x-www-form-urlencoded; charset=utf-8",
                    ),
                    ("flotilla-credential", &self.credential),
                    ("flotilla-aws-service", service),
                    ("flotilla-aws-region", &self.region),
                ],
                body: Some(body.as_bytes()),
            },
        )?;
        if (200..300).contains(&status) {
            Ok(Xml(text))
        } else {
            Err(classify(action, status, &text))
        }
    }
}

/// Sends one request; its status and body text. A request that cannot be described is the
/// settings' fault; one that did not complete is transient.
fn send(action: &str, request: &Request<'_>) -> Result<(u16, String), Error> {
    match flotilla_guest_http::send(request) {
        Ok(response) => response
            .into_text()
            .map_err(|e| Error::Transient(format!("{action}: {e}"))),
        Err(flotilla_guest_http::Error::Invalid(e)) => {
            Err(Error::InvalidConfig(format!("{action}: {e}")))
        }
        Err(e) => Err(Error::Transient(format!("{action}: {e}"))),
    }
}
