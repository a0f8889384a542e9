//! The official cloud plugins bound to their peers: each stand-in cloud (moto, the Compute
//! and the scale-set stand-ins, which live in `flotilla-peers` and know nothing of plugins)
//! gets the credential, the sandbox and the loaded plugin a pool of it would have. Import the
//! cloud's trait to call these on it.

use flotilla_credentials::azure::{AzureConfig, AzureHandle};
use flotilla_credentials::gcp::{GcpConfig, GcpHandle};
use flotilla_credentials::{Credential, CredentialKind, Secret, SecretSource};
use flotilla_net::AllowList;
use flotilla_peers::azure_cloud::AzureCloud;
use flotilla_peers::gcp_cloud::GcpCloud;
use flotilla_peers::moto::Moto;
use flotilla_plugin_runtime::{Sandbox, WasmProvider};
use flotilla_test_artifacts as guests;

use crate::load;

/// A sandbox allowed to reach only `endpoint` (on loopback), holding `credentials`.
fn only(endpoint: &str, credentials: Vec<Credential>) -> Sandbox {
    let mut sandbox = Sandbox::default();
    sandbox.egress.allow = allow(endpoint);
    sandbox.egress.allowed_ip_ranges = vec!["127.0.0.0/8".parse().unwrap()];
    sandbox.egress.credentials = credentials;
    sandbox
}

fn allow(endpoint: &str) -> AllowList {
    AllowList::parse(&[endpoint]).unwrap_or_else(|e| panic!("{e:?}"))
}

/// The AWS plugin on moto.
pub trait AwsPlugin {
    /// The AWS plugin signing with the plugin user's keys (or a wrong secret).
    fn provider(&self, secret_override: Option<&str>) -> WasmProvider;
    /// The sandbox of [`AwsPlugin::provider`] (the plugin user's key), to change before loading.
    fn plugin_sandbox(&self) -> Sandbox;
    /// The AWS plugin whose credential is the given kind.
    fn provider_with(&self, kind: CredentialKind) -> WasmProvider;
    /// The AWS plugin in a pool whose connector key is `ssh_public_key`.
    fn provider_with_ssh_key(&self, ssh_public_key: &str) -> WasmProvider;
}

fn sigv4(key: String, secret: String) -> CredentialKind {
    CredentialKind::AwsSigv4 {
        access_key_id: SecretSource::Value(Secret::new(key)),
        secret_access_key: SecretSource::Value(Secret::new(secret)),
        session_token: None,
        region: None,
        service: None,
    }
}

/// The sandbox of an AWS pool signing with `kind`, allowed to reach only moto.
fn aws_sandbox(moto: &Moto, kind: CredentialKind) -> Sandbox {
    let credential = Credential {
        name: "aws".into(),
        kind,
        hosts: allow(&moto.endpoint),
    };
    only(&moto.endpoint, vec![credential])
}

impl AwsPlugin for Moto {
    fn provider(&self, secret_override: Option<&str>) -> WasmProvider {
        let (key, secret) = self.key("plugin");
        let secret = secret_override.map_or(secret, str::to_string);
        self.provider_with(sigv4(key, secret))
    }

    fn plugin_sandbox(&self) -> Sandbox {
        let (key, secret) = self.key("plugin");
        aws_sandbox(self, sigv4(key, secret))
    }

    fn provider_with(&self, kind: CredentialKind) -> WasmProvider {
        load(guests::AWS_PLUGIN).provider("aws", aws_sandbox(self, kind))
    }

    fn provider_with_ssh_key(&self, ssh_public_key: &str) -> WasmProvider {
        let mut sandbox = self.plugin_sandbox();
        sandbox.ssh_public_key = Some(ssh_public_key.into());
        load(guests::AWS_PLUGIN).provider("aws", sandbox)
    }
}

/// The GCP plugin on the Compute stand-in.
pub trait GcpPlugin {
    /// The `gcp` credential with the metadata server at this stand-in, as a pool would hold it.
    fn credential(&self) -> Credential;
    /// The GCP plugin holding `credential`, allowed to reach only this stand-in.
    fn provider(&self, credential: Credential) -> WasmProvider;
    /// The sandbox of a pool holding `credential`, allowed to reach only this stand-in.
    fn sandbox(&self, credential: Credential) -> Sandbox;
}

impl GcpPlugin for GcpCloud {
    fn credential(&self) -> Credential {
        Credential {
            name: "gcp".into(),
            kind: CredentialKind::Gcp(GcpHandle::new(GcpConfig {
                metadata_endpoint: Some(self.endpoint.clone()),
                scopes: vec!["https://www.googleapis.com/auth/compute".into()],
                ..GcpConfig::default()
            })),
            hosts: allow(&self.endpoint),
        }
    }

    fn provider(&self, credential: Credential) -> WasmProvider {
        load(guests::GCP_PLUGIN).provider("gcp", self.sandbox(credential))
    }

    fn sandbox(&self, credential: Credential) -> Sandbox {
        only(&self.endpoint, vec![credential])
    }
}

/// The Azure plugin on the scale-set stand-in.
pub trait AzurePlugin {
    /// An `azure` credential minting from this server's managed-identity endpoint.
    fn credential(&self) -> Credential;
    /// The Azure plugin with a fresh credential.
    fn provider(&self) -> WasmProvider;
    /// The Azure plugin authorised by `credential` (share one to share its token cache).
    fn provider_with(&self, credential: Credential) -> WasmProvider;
    /// The sandbox of an Azure pool authorised by `credential`, allowed to reach only this
    /// server (and trusting its certificate authority, when it serves TLS).
    fn sandbox(&self, credential: Credential) -> Sandbox;
}

impl AzurePlugin for AzureCloud {
    fn credential(&self) -> Credential {
        Credential {
            name: "azure".into(),
            kind: CredentialKind::Azure(AzureHandle::new(AzureConfig {
                imds_endpoint: Some(self.imds.clone()),
                ..AzureConfig::default()
            })),
            hosts: allow(&self.endpoint),
        }
    }

    fn provider(&self) -> WasmProvider {
        self.provider_with(self.credential())
    }

    fn provider_with(&self, credential: Credential) -> WasmProvider {
        load(guests::AZURE_PLUGIN).provider("azure", self.sandbox(credential))
    }

    fn sandbox(&self, credential: Credential) -> Sandbox {
        let mut sandbox = only(&self.endpoint, vec![credential]);
        sandbox.egress.extra_roots.extend(self.ca.clone());
        sandbox
    }
}
