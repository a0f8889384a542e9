//! Azure Blob for the runner's cache: Azurite (npm `azurite`, in `FLOTILLA_NPM`) over HTTPS,
//! holding one container, and the GoCloud URL plus blob SAS token the runner's `cache/azure`
//! adapter gives the helper. The adapter never presigns URLs (`cache/azure/adapter.go`
//! `GetUploadURL`: a PUT from a URL is limited to 5 MB); the helper's GoCloud client builds the
//! blob URL from the env instead.
//!
//! Azurite checks SAS tokens for real (its own `BlobSASAuthenticator`): the HMAC over the
//! string-to-sign with the account key, the permission against the operation, and the start
//! and expiry times. The runner's tokens say `spr=https`, so Azurite serves HTTPS only, with a
//! certificate for its address from a fresh CA ([`AzureStore::ca_pem`]). It is path-style
//! (`https://IP:PORT/<account>/<container>/<blob>`), which GoCloud's azureblob builds for a
//! local emulator: the env also carries GoCloud's own `AZURE_STORAGE_IS_LOCAL_EMULATOR=true`
//! (`blob/azureblob/azureblob.go` `NewServiceURL`; GoCloud takes an emulator for granted
//! only on `localhost` or `127.0.0.1`, not on the peers' address).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime};

use base64::Engine;

use super::{Access, JOB_TIMEOUT, TlsFiles, curl, encode_path};

/// Azurite's well-known development account and its published key (Azurite's README,
/// "Default Storage Account"; the same key Azure's storage emulator always had). Not a secret.
pub const ACCOUNT: &str = "devstoreaccount1";
const ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// The `sv` the tokens carry. The runner's SDK (`azblob` v1.8.0, `sas.BlobSignatureValues`)
/// stamps its generated service version; every version from 2020-12-06 on signs the fields
/// below (Microsoft's "Create a service SAS", "Version 2020-12-06 and later"), and this one is
/// the newest Azurite 3.35 lists (`ValidAPIVersions`).
pub const SAS_VERSION: &str = "2025-11-05";

/// Where `scripts/test.sh` installs npm packages for the tests.
pub fn npm_dir() -> PathBuf {
    std::env::var_os("FLOTILLA_NPM")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/flotilla-npm")
        })
}

/// Azurite behind the runner's `[runners.cache.azure]` with `AccountName` = [`ACCOUNT`], its
/// `AccountKey`, `ContainerName` = [`AzureStore::CONTAINER`] and `StorageDomain` = this store.
pub struct AzureStore {
    child: Child,
    address: SocketAddr,
    tls: TlsFiles,
    /// Azurite's data and the CA file curl trusts.
    dir: tempfile::TempDir,
    timeout: Duration,
}

impl Drop for AzureStore {
    fn drop(&mut self) {
        let _ = self.child.kill(); // already gone is fine
        let _ = self.child.wait();
    }
}

impl AzureStore {
    pub const CONTAINER: &'static str = "flotilla-cache";

    /// Starts Azurite's blob service on `ip` over HTTPS (a certificate for `ip` from a fresh CA;
    /// a port of the kernel's choosing, read from Azurite's own line) and creates the container.
    pub async fn start(ip: IpAddr) -> AzureStore {
        let dir = tempfile::tempdir().expect("a directory for Azurite");
        let tls = TlsFiles::for_ip(ip);
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write a PEM file");
            path
        };
        let cert = write("cert.pem", &tls.cert_pem);
        let key = write("key.pem", &tls.key_pem);
        write("ca.pem", &tls.ca_pem);
        let bin = npm_dir().join("node_modules/.bin/azurite-blob");
        let mut child = Command::new(&bin)
            .args([
                "--blobHost",
                &ip.to_string(),
                "--blobPort",
                "0",
                "--location",
            ])
            .arg(dir.path().join("data"))
            .arg("--cert")
            .arg(&cert)
            .arg("--key")
            .arg(&key)
            .args(["--silent", "--disableTelemetry"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("{}: {e} (scripts/test.sh installs azurite)", bin.display())
            });
        let stdout = child.stdout.take().expect("Azurite's stdout is piped");
        let marker = format!("listens on https://{}:", super::url_host(ip));
        let port = super::announced_port(stdout, marker, Duration::from_secs(60));
        let mut store = AzureStore {
            child,
            address: SocketAddr::new(ip, 0),
            tls,
            dir,
            timeout: JOB_TIMEOUT,
        };
        store
            .address
            .set_port(port.expect("Azurite did not say which port it listens on"));
        store.create_container();
        store
    }

    /// The runner's `StorageDomain` for this store: `ip:port`.
    pub fn storage_domain(&self) -> String {
        self.address.to_string()
    }

    /// The blob service URL of the account, path-style as Azurite serves it.
    pub fn service_url(&self) -> String {
        format!("https://{}/{ACCOUNT}", self.address)
    }

    /// GoCloud URL plus a read SAS for `object`, valid for the job timeout.
    pub fn download(&self, object: &str) -> Access {
        self.access(object, Permission::Read, SystemTime::now(), self.timeout)
    }

    /// GoCloud URL plus a write SAS for `object`, valid for the job timeout.
    pub fn upload(&self, object: &str) -> Access {
        self.access(object, Permission::Write, SystemTime::now(), self.timeout)
    }

    /// [`AzureStore::download`] signed at `now` for `timeout`.
    pub fn download_at(&self, object: &str, now: SystemTime, timeout: Duration) -> Access {
        self.access(object, Permission::Read, now, timeout)
    }

    /// [`AzureStore::upload`] signed at `now` for `timeout`.
    pub fn upload_at(&self, object: &str, now: SystemTime, timeout: Duration) -> Access {
        self.access(object, Permission::Write, now, timeout)
    }

    /// What the container holds under `object`, read with Azurite's Get Blob and a read SAS;
    /// `None` when it holds nothing there.
    pub fn object(&self, object: &str) -> Option<Vec<u8>> {
        let sas = self.blob_sas(object, Permission::Read, SystemTime::now(), self.timeout);
        let url = format!("{}?{sas}", self.blob_url(object));
        let ca = self.ca_file();
        let (status, body) = curl(&["--cacert", &ca, &url]);
        (status == 200).then_some(body)
    }

    /// The CA certificate (PEM) that signed Azurite's certificate, for the helper to trust.
    pub fn ca_pem(&self) -> Option<String> {
        Some(self.tls.ca_pem.clone())
    }

    /// The URL of `object`'s blob (no token).
    pub fn blob_url(&self, object: &str) -> String {
        format!(
            "{}/{}/{}",
            self.service_url(),
            Self::CONTAINER,
            encode_path(object)
        )
    }

    /// The CA certificate as a file, for curl's `--cacert`.
    pub fn ca_file(&self) -> String {
        self.dir.path().join("ca.pem").display().to_string()
    }

    /// `cache/azure/adapter.go` `GetGoCloudURL` and `getEnv`: `azblob://<container>/<object>`,
    /// `AZURE_STORAGE_ACCOUNT`, `AZURE_STORAGE_DOMAIN` and `AZURE_STORAGE_SAS_TOKEN`, plus
    /// GoCloud's `AZURE_STORAGE_IS_LOCAL_EMULATOR` (the module doc says why).
    fn access(
        &self,
        object: &str,
        permission: Permission,
        now: SystemTime,
        timeout: Duration,
    ) -> Access {
        Access::GoCloud {
            url: format!("azblob://{}/{object}", Self::CONTAINER),
            env: vec![
                ("AZURE_STORAGE_ACCOUNT".into(), ACCOUNT.into()),
                ("AZURE_STORAGE_DOMAIN".into(), self.storage_domain()),
                (
                    "AZURE_STORAGE_SAS_TOKEN".into(),
                    self.blob_sas(object, permission, now, timeout),
                ),
                ("AZURE_STORAGE_IS_LOCAL_EMULATOR".into(), "true".into()),
            ],
        }
    }

    fn blob_sas(
        &self,
        object: &str,
        permission: Permission,
        now: SystemTime,
        timeout: Duration,
    ) -> String {
        blob_sas(&BlobSas {
            container: Self::CONTAINER,
            blob: object,
            permission,
            now,
            timeout,
        })
    }

    /// Create Container with an account SAS (service `b`, resource type `c`, permission `c`):
    /// the runner never creates the container, the operator does.
    fn create_container(&self) {
        let sas = account_sas(SystemTime::now(), Duration::from_secs(600));
        let url = format!(
            "{}/{}?restype=container&{sas}",
            self.service_url(),
            Self::CONTAINER
        );
        let ca = self.ca_file();
        let (status, body) = curl(&[
            "--cacert",
            &ca,
            "-X",
            "PUT",
            "-H",
            "Content-Length: 0",
            &url,
        ]);
        assert_eq!(
            status,
            201,
            "create the container: {}",
            String::from_utf8_lossy(&body)
        );
    }
}

/// The one permission each direction gets (`cache/azure/azure.go`
/// `generateBlobSignatureValues`: `BlobPermissions{Read}`, or `{Write}` for PUT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    Read,
    Write,
}

impl Permission {
    pub fn letter(self) -> &'static str {
        match self {
            Permission::Read => "r",
            Permission::Write => "w",
        }
    }
}

/// What one blob SAS covers.
pub struct BlobSas<'a> {
    pub container: &'a str,
    pub blob: &'a str,
    pub permission: Permission,
    pub now: SystemTime,
    pub timeout: Duration,
}

/// A service SAS for one blob, signed with the account key, as `azblob`'s
/// `BlobSignatureValues.SignWithSharedKey` makes it from the runner's values
/// (`generateBlobSignatureValues`: `spr=https`, start now - 1 h, expiry now + timeout, `sr=b`).
/// String-to-sign: Microsoft's "Create a service SAS", version 2020-12-06 and later.
pub fn blob_sas(sas: &BlobSas<'_>) -> String {
    let start = sas_time(sas.now - Duration::from_secs(3600));
    let expiry = sas_time(sas.now + sas.timeout);
    let resource = format!("/blob/{ACCOUNT}/{}/{}", sas.container, sas.blob);
    let permission = sas.permission.letter();
    // sp, st, se, canonicalized resource, si, sip, spr, sv, sr, snapshot time, ses, then
    // rscc, rscd, rsce, rscl, rsct: empty fields stay as empty lines.
    let to_sign = [
        permission,
        &start,
        &expiry,
        &resource,
        "",
        "",
        "https",
        SAS_VERSION,
        "b",
        "",
        "",
        "",
        "",
        "",
        "",
        "",
    ]
    .join("\n");
    let signature = hmac_account_key(&to_sign);
    encode_sorted(&[
        ("se", &expiry),
        ("sig", &signature),
        ("sp", permission),
        ("spr", "https"),
        ("sr", "b"),
        ("st", &start),
        ("sv", SAS_VERSION),
    ])
}

/// An account SAS allowing container creation (Microsoft's "Create an account SAS", version
/// 2020-12-06 and later: account, sp, ss, srt, st, se, sip, spr, sv, ses, and a final newline).
fn account_sas(now: SystemTime, timeout: Duration) -> String {
    let start = sas_time(now - Duration::from_secs(300));
    let expiry = sas_time(now + timeout);
    let to_sign = [
        ACCOUNT,
        "c",
        "b",
        "c",
        &start,
        &expiry,
        "",
        "https",
        SAS_VERSION,
        "",
        "",
    ]
    .join("\n");
    let signature = hmac_account_key(&to_sign);
    encode_sorted(&[
        ("se", &expiry),
        ("sig", &signature),
        ("sp", "c"),
        ("spr", "https"),
        ("srt", "c"),
        ("ss", "b"),
        ("st", &start),
        ("sv", SAS_VERSION),
    ])
}

/// `yyyy-MM-ddTHH:mm:ssZ` in UTC (`sas.TimeFormat`).
fn sas_time(at: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(at)
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Base64 of HMAC-SHA256 over `text` with the base64-decoded account key
/// (`exported.ComputeHMACSHA256`).
fn hmac_account_key(text: &str) -> String {
    let engine = base64::engine::general_purpose::STANDARD;
    let key = engine
        .decode(ACCOUNT_KEY)
        .expect("the published key is base64");
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key);
    engine.encode(ring::hmac::sign(&key, text.as_bytes()).as_ref())
}

/// `url.Values.Encode`: keys in order (the callers list them sorted), values query-escaped.
fn encode_sorted(pairs: &[(&str, &str)]) -> String {
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        out.append_pair(k, v);
    }
    out.finish()
}
