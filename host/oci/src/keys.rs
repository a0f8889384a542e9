//! cosign's key files: the encrypted private key `cosign generate-key-pair` writes, and the PEM
//! public key. Signatures are ECDSA P-256 with SHA-256 in ASN.1 DER, as cosign makes them; a
//! public key may also be P-384, Ed25519 or RSA (a key pair made elsewhere, or by a KMS).
//!
//! The cryptography is ring's (the TLS stack's own), the key derivation `scrypt`, and the
//! cipher NaCl's secretbox (XSalsa20-Poly1305), as cosign writes the file:
//!
//! ```text
//! -----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----
//! base64 of {"kdf":{"name":"scrypt","params":{"N":32768,"r":8,"p":1},"salt":"<base64>"},
//!            "cipher":{"name":"nacl/secretbox","nonce":"<base64>"},"ciphertext":"<base64>"}
//! -----END ENCRYPTED SIGSTORE PRIVATE KEY-----
//! ```
//!
//! The ciphertext opens to the PKCS#8 DER of the private key. Older cosign releases wrote the
//! label `ENCRYPTED COSIGN PRIVATE KEY`; both are read. Only cosign's two scrypt strengths
//! (N = 2^15 and 2^16, r = 8, p = 1) are accepted, so a key file cannot make the host spend
//! unbounded memory or time deriving a key.

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use crypto_secretbox::aead::{Aead, KeyInit};
use crypto_secretbox::{Nonce, XSalsa20Poly1305};
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{self, EcdsaKeyPair, KeyPair as _, UnparsedPublicKey, VerificationAlgorithm};
use serde::{Deserialize, Serialize};
use spki::der::Decode;
use spki::{ObjectIdentifier, SubjectPublicKeyInfoRef};
use zeroize::Zeroizing;

use super::OciError;

/// The label `cosign generate-key-pair` writes (and the older one it wrote before).
const ENCRYPTED_LABELS: [&str; 2] = [
    "ENCRYPTED SIGSTORE PRIVATE KEY",
    "ENCRYPTED COSIGN PRIVATE KEY",
];
const KDF: &str = "scrypt";
const CIPHER: &str = "nacl/secretbox";
/// cosign's scrypt cost for new keys (2^15), and the higher one it also reads (2^16).
const SCRYPT_LOG_N: u8 = 15;
const SCRYPT_LOG_N_HIGH: u8 = 16;
const SCRYPT_R: u32 = 8;
const SCRYPT_P: u32 = 1;
const SALT_LEN: usize = 32;
const NONCE_LEN: usize = 24;

const OID_EC: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const OID_P256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
const OID_P384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.34");
const OID_ED25519: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.112");
const OID_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");

/// The DER of a P-256 SubjectPublicKeyInfo up to its key: SEQUENCE { SEQUENCE { id-ecPublicKey,
/// prime256v1 }, BIT STRING (no unused bits) }, followed by the 65-byte uncompressed point.
/// The algorithms a public key's signatures are checked with, by key type.
type Algorithms = &'static [&'static dyn VerificationAlgorithm];
static P256: [&dyn VerificationAlgorithm; 1] = [&signature::ECDSA_P256_SHA256_ASN1];
/// P-384: SHA-384, as sigstore-rs signs, or SHA-256, as cosign does with any ECDSA key.
static P384: [&dyn VerificationAlgorithm; 2] = [
    &signature::ECDSA_P384_SHA384_ASN1,
    &signature::ECDSA_P384_SHA256_ASN1,
];
static ED25519: [&dyn VerificationAlgorithm; 1] = [&signature::ED25519];
/// RSA as cosign verifies it: PKCS#1 v1.5 with SHA-256.
static RSA: [&dyn VerificationAlgorithm; 1] = [&signature::RSA_PKCS1_2048_8192_SHA256];

const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

fn key_err(path: &Path, why: impl Into<String>) -> OciError {
    OciError::Key {
        path: path.display().to_string(),
        why: why.into(),
    }
}

/// A private signing key (cosign's encrypted PEM, or a plain PKCS#8 `PRIVATE KEY`).
pub struct KeyPair {
    key: EcdsaKeyPair,
    rng: SystemRandom,
}

impl std::fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyPair(ECDSA P-256)")
    }
}

impl KeyPair {
    /// Loads `cosign.key`, decrypting it with `password` (cosign's `COSIGN_PASSWORD`).
    pub fn load(path: &Path, password: &[u8]) -> Result<Self, OciError> {
        let text = Zeroizing::new(
            std::fs::read(path).map_err(|e| key_err(path, format!("cannot read key: {e}")))?,
        );
        let Some(block) = pem_block(&text) else {
            return Err(key_err(
                path,
                "not a private key PEM (expected cosign.key, not cosign.pub)",
            ));
        };
        let pkcs8 = if ENCRYPTED_LABELS.contains(&block.label.as_str()) {
            decrypt(&block.der, password).map_err(|why| key_err(path, why))?
        } else if block.label == "PRIVATE KEY" {
            block.der
        } else if block.label.ends_with("PRIVATE KEY") {
            return Err(key_err(
                path,
                format!(
                    "not a usable private key: `{}` is not read; cosign's encrypted key or an unencrypted PKCS#8 `PRIVATE KEY` is (convert with `openssl pkcs8 -topk8 -nocrypt`)",
                    block.label
                ),
            ));
        } else {
            return Err(key_err(
                path,
                "not a private key PEM (expected cosign.key, not cosign.pub)",
            ));
        };
        let rng = SystemRandom::new();
        let key =
            EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, &pkcs8, &rng)
                .map_err(|e| {
                    key_err(
                        path,
                        format!("cannot sign with this key: {e} (cosign keys are ECDSA P-256)"),
                    )
                })?;
        Ok(KeyPair { key, rng })
    }

    /// Signs `payload`, returning the base64 signature cosign stores in the annotation.
    pub(crate) fn sign(&self, payload: &[u8]) -> Result<String, String> {
        let sig = self
            .key
            .sign(&self.rng, payload)
            .map_err(|e| format!("signing failed: {e}"))?;
        Ok(STANDARD.encode(sig.as_ref()))
    }
}

/// A public verification key (`cosign.pub`).
pub struct PublicKey {
    /// The algorithms a signature may verify under.
    algorithms: Algorithms,
    /// The key as ring reads it: the point, the Ed25519 key, or the RSAPublicKey DER.
    key: Vec<u8>,
    kind: &'static str,
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublicKey")
            .field("kind", &self.kind)
            .finish()
    }
}

impl PublicKey {
    /// Loads a PEM public key (`PUBLIC KEY`: a SubjectPublicKeyInfo).
    pub fn load(path: &Path) -> Result<Self, OciError> {
        let text =
            std::fs::read(path).map_err(|e| key_err(path, format!("cannot read key: {e}")))?;
        Self::from_pem(&text)
            .map_err(|why| key_err(path, format!("not a usable public key: {why}")))
    }

    fn from_pem(text: &[u8]) -> Result<Self, String> {
        let block = pem_block(text).ok_or("no PEM block")?;
        if block.label != "PUBLIC KEY" {
            return Err(format!("a {} PEM block, not a PUBLIC KEY", block.label));
        }
        let spki = SubjectPublicKeyInfoRef::from_der(&block.der)
            .map_err(|e| format!("not a SubjectPublicKeyInfo: {e}"))?;
        let key = spki
            .subject_public_key
            .as_bytes()
            .ok_or("the key's bit string has unused bits")?
            .to_vec();
        let curve = || {
            spki.algorithm
                .parameters
                .and_then(|p| p.decode_as::<ObjectIdentifier>().ok())
        };
        let (algorithms, kind): (Algorithms, _) = match spki.algorithm.oid {
            OID_EC if curve() == Some(OID_P256) => (&P256, "ECDSA P-256"),
            OID_EC if curve() == Some(OID_P384) => (&P384, "ECDSA P-384"),
            OID_EC => return Err("an elliptic curve other than P-256 or P-384".to_string()),
            OID_ED25519 => (&ED25519, "Ed25519"),
            OID_RSA => (&RSA, "RSA"),
            other => {
                return Err(format!(
                    "key algorithm {other} (ECDSA P-256 or P-384, Ed25519 or RSA are read)"
                ));
            }
        };
        Ok(PublicKey {
            algorithms,
            key,
            kind,
        })
    }

    pub(crate) fn verifies(&self, payload: &[u8], signature_b64: &str) -> bool {
        let Ok(sig) = STANDARD.decode(signature_b64.trim()) else {
            return false;
        };
        self.algorithms.iter().any(|alg| {
            UnparsedPublicKey::new(*alg, &self.key)
                .verify(payload, &sig)
                .is_ok()
        })
    }
}

/// Creates a new ECDSA P-256 key pair in cosign's format: (encrypted `cosign.key`, `cosign.pub`).
pub fn generate_key_pair(password: &[u8]) -> Result<(Zeroizing<String>, String), String> {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
        .map_err(|e| format!("cannot make a key: {e}"))?;
    let pair = EcdsaKeyPair::from_pkcs8(
        &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        pkcs8.as_ref(),
        &rng,
    )
    .map_err(|e| format!("cannot read the key just made: {e}"))?;
    let mut spki = P256_SPKI_PREFIX.to_vec();
    spki.extend_from_slice(pair.public_key().as_ref());
    let sealed = encrypt(pkcs8.as_ref(), password, &rng)?;
    Ok((
        Zeroizing::new(pem_text(ENCRYPTED_LABELS[0], &sealed)),
        pem_text("PUBLIC KEY", &spki),
    ))
}

/// The JSON inside cosign's encrypted key.
#[derive(Serialize, Deserialize)]
struct Sealed {
    kdf: Kdf,
    cipher: Cipher,
    ciphertext: String,
}

#[derive(Serialize, Deserialize)]
struct Kdf {
    name: String,
    params: ScryptParams,
    salt: String,
}

#[derive(Serialize, Deserialize)]
struct ScryptParams {
    #[serde(rename = "N")]
    n: u64,
    r: u32,
    p: u32,
}

#[derive(Serialize, Deserialize)]
struct Cipher {
    name: String,
    nonce: String,
}

/// The secretbox key scrypt derives from the password, for cosign's parameters only.
fn derive(
    password: &[u8],
    salt: &[u8],
    params: &ScryptParams,
) -> Result<Zeroizing<[u8; 32]>, String> {
    let log_n = match params.n {
        n if n == 1 << SCRYPT_LOG_N => SCRYPT_LOG_N,
        n if n == 1 << SCRYPT_LOG_N_HIGH => SCRYPT_LOG_N_HIGH,
        n => {
            return Err(format!(
                "unexpected scrypt cost N = {n} (cosign writes 32768 or 65536)"
            ));
        }
    };
    if (params.r, params.p) != (SCRYPT_R, SCRYPT_P) {
        return Err(format!(
            "unexpected scrypt parameters r = {}, p = {} (cosign writes 8 and 1)",
            params.r, params.p
        ));
    }
    let scrypt_params = scrypt::Params::new(log_n, SCRYPT_R, SCRYPT_P)
        .map_err(|e| format!("scrypt parameters: {e}"))?;
    let mut key = Zeroizing::new([0u8; 32]);
    scrypt::scrypt(password, salt, &scrypt_params, key.as_mut())
        .map_err(|e| format!("scrypt: {e}"))?;
    Ok(key)
}

/// Opens cosign's encrypted key (the PEM block's bytes) to its PKCS#8 DER.
fn decrypt(sealed: &[u8], password: &[u8]) -> Result<Zeroizing<Vec<u8>>, String> {
    let sealed: Sealed = serde_json::from_slice(sealed)
        .map_err(|e| format!("not a usable private key: not cosign's encrypted key: {e}"))?;
    if sealed.kdf.name != KDF || sealed.cipher.name != CIPHER {
        return Err(format!(
            "not a usable private key: encrypted with {} and {} (cosign uses {KDF} and {CIPHER})",
            sealed.kdf.name, sealed.cipher.name
        ));
    }
    let field = |name: &str, b64: &str| {
        STANDARD
            .decode(b64)
            .map_err(|e| format!("not a usable private key: the {name} is not base64: {e}"))
    };
    let salt = field("salt", &sealed.kdf.salt)?;
    let nonce = field("nonce", &sealed.cipher.nonce)?;
    let ciphertext = field("ciphertext", &sealed.ciphertext)?;
    if nonce.len() != NONCE_LEN {
        return Err(format!(
            "not a usable private key: a nonce of {} bytes, not {NONCE_LEN}",
            nonce.len()
        ));
    }
    let key = derive(password, &salt, &sealed.kdf.params)
        .map_err(|why| format!("not a usable private key: {why}"))?;
    let cipher = XSalsa20Poly1305::new_from_slice(key.as_ref())
        .map_err(|_| "not a usable private key: the derived key has the wrong size".to_string())?;
    cipher
        .decrypt(Nonce::from_slice(&nonce), ciphertext.as_slice())
        .map(Zeroizing::new)
        .map_err(|_| "cannot decrypt the private key; check COSIGN_PASSWORD".to_string())
}

/// Seals `pkcs8` as cosign does (fresh salt and nonce), returning the JSON bytes.
fn encrypt(pkcs8: &[u8], password: &[u8], rng: &SystemRandom) -> Result<Vec<u8>, String> {
    let mut salt = [0u8; SALT_LEN];
    let mut nonce = [0u8; NONCE_LEN];
    rng.fill(&mut salt)
        .and_then(|()| rng.fill(&mut nonce))
        .map_err(|_| "no randomness for the key's salt and nonce".to_string())?;
    let params = ScryptParams {
        n: 1 << SCRYPT_LOG_N,
        r: SCRYPT_R,
        p: SCRYPT_P,
    };
    let key = derive(password, &salt, &params)?;
    let cipher = XSalsa20Poly1305::new_from_slice(key.as_ref())
        .map_err(|_| "the derived key has the wrong size".to_string())?;
    let ciphertext = cipher
        .encrypt(Nonce::from_slice(&nonce), pkcs8)
        .map_err(|_| "cannot encrypt the private key".to_string())?;
    let sealed = Sealed {
        kdf: Kdf {
            name: KDF.to_string(),
            params,
            salt: STANDARD.encode(salt),
        },
        cipher: Cipher {
            name: CIPHER.to_string(),
            nonce: STANDARD.encode(nonce),
        },
        ciphertext: STANDARD.encode(ciphertext),
    };
    serde_json::to_vec(&sealed).map_err(|e| format!("cannot write the key: {e}"))
}

/// The first PEM block of a file: its label and its bytes.
struct PemBlock {
    label: String,
    der: Zeroizing<Vec<u8>>,
}

fn pem_block(text: &[u8]) -> Option<PemBlock> {
    let text = std::str::from_utf8(text).ok()?;
    let mut lines = text.lines().map(str::trim);
    let label = lines.find_map(|l| l.strip_prefix("-----BEGIN ")?.strip_suffix("-----"))?;
    let end = format!("-----END {label}-----");
    let mut body = Zeroizing::new(String::new());
    for line in lines.by_ref() {
        if line == end {
            let der = STANDARD.decode(body.as_bytes()).ok()?;
            return Some(PemBlock {
                label: label.to_string(),
                der: Zeroizing::new(der),
            });
        }
        body.push_str(line);
    }
    None
}

/// A PEM block with 64-character lines, as cosign and OpenSSL write them.
fn pem_text(label: &str, der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::process::Command;

    use super::*;

    const PAYLOAD: &[u8] = b"{\"critical\":{\"type\":\"cosign container image signature\"}}";

    fn testdata(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/testdata")
            .join(name)
    }

    fn write(dir: &Path, name: &str, text: &[u8]) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
        path
    }

    fn why(result: Result<impl std::fmt::Debug, OciError>) -> String {
        match result {
            Ok(v) => panic!("expected a refusal, got {v:?}"),
            Err(e) => e.to_string(),
        }
    }

    /// The public key of a P-256 private key, as `cosign.pub` would hold it.
    fn public_of(pair: &KeyPair) -> PublicKey {
        let mut spki = P256_SPKI_PREFIX.to_vec();
        spki.extend_from_slice(pair.key.public_key().as_ref());
        PublicKey::from_pem(pem_text("PUBLIC KEY", &spki).as_bytes())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn openssl(args: &[&str], dir: &Path) -> Vec<u8> {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap_or_else(|e| panic!("openssl: {e}"));
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    #[test]
    fn a_key_cosign_wrote_opens_and_signs() {
        // Go's cosign, an empty password, scrypt at N = 65536.
        let pair = KeyPair::load(&testdata("cosign-go-empty-password.key"), b"")
            .unwrap_or_else(|e| panic!("{e}"));
        let sig = pair.sign(PAYLOAD).unwrap_or_else(|e| panic!("{e}"));
        assert!(public_of(&pair).verifies(PAYLOAD, &sig));
        assert!(!public_of(&pair).verifies(b"another payload", &sig));
        let wrong = why(KeyPair::load(
            &testdata("cosign-go-empty-password.key"),
            b"guess",
        ));
        assert!(wrong.contains("check COSIGN_PASSWORD"), "{wrong}");
    }

    #[test]
    fn the_keys_and_signature_sigstore_rs_made_still_work() {
        let public =
            PublicKey::load(&testdata("sigstore-rs.pub")).unwrap_or_else(|e| panic!("{e}"));
        let theirs = std::fs::read_to_string(testdata("sigstore-rs.sig")).unwrap_or_default();
        assert!(
            public.verifies(PAYLOAD, &theirs),
            "sigstore-rs's own signature"
        );
        let pair = KeyPair::load(&testdata("sigstore-rs.key"), b"fixture password")
            .unwrap_or_else(|e| panic!("{e}"));
        let ours = pair.sign(PAYLOAD).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            public.verifies(PAYLOAD, &ours),
            "a signature made with the loaded key"
        );
        assert!(!public.verifies(PAYLOAD, &ours.replacen('M', "N", 1)));
    }

    #[test]
    fn a_generated_pair_has_cosigns_shape_and_works() {
        let (private, public) = generate_key_pair(b"pw").unwrap_or_else(|e| panic!("{e}"));
        let block = pem_block(private.as_bytes()).unwrap_or_else(|| panic!("no PEM"));
        assert_eq!(block.label, "ENCRYPTED SIGSTORE PRIVATE KEY");
        let sealed: Sealed = serde_json::from_slice(&block.der).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (sealed.kdf.name.as_str(), sealed.cipher.name.as_str()),
            (KDF, CIPHER)
        );
        let p = &sealed.kdf.params;
        assert_eq!((p.n, p.r, p.p), (32768, 8, 1));
        assert_eq!(
            STANDARD.decode(&sealed.kdf.salt).map(|s| s.len()).ok(),
            Some(SALT_LEN)
        );
        assert_eq!(
            STANDARD.decode(&sealed.cipher.nonce).map(|n| n.len()).ok(),
            Some(NONCE_LEN)
        );
        assert!(private.lines().all(|l| l.len() <= 64) && public.lines().all(|l| l.len() <= 64));

        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let key = write(dir.path(), "cosign.key", private.as_bytes());
        let public = PublicKey::load(&write(dir.path(), "cosign.pub", public.as_bytes()))
            .unwrap_or_else(|e| panic!("{e}"));
        let sig = KeyPair::load(&key, b"pw")
            .and_then(|pair| pair.sign(PAYLOAD).map_err(|e| key_err(&key, e)))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(public.verifies(PAYLOAD, &sig));
        assert!(why(KeyPair::load(&key, b"PW")).contains("check COSIGN_PASSWORD"));
        // Two pairs never share a key, a salt or a nonce.
        let (again, _) = generate_key_pair(b"pw").unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(*again, *private);
    }

    #[test]
    fn keys_and_signatures_openssl_makes_verify() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let d = dir.path();
        std::fs::write(d.join("payload"), PAYLOAD).unwrap_or_else(|e| panic!("{e}"));
        let dgst = |hash| vec!["dgst", hash, "-sign", "k.pem", "-out", "sig", "payload"];
        let keys = [
            (
                "ECDSA P-256",
                vec!["EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
                dgst("-sha256"),
            ),
            (
                "ECDSA P-384",
                vec!["EC", "-pkeyopt", "ec_paramgen_curve:P-384"],
                dgst("-sha384"),
            ),
            // cosign signs with SHA-256 whatever the curve.
            (
                "ECDSA P-384",
                vec!["EC", "-pkeyopt", "ec_paramgen_curve:P-384"],
                dgst("-sha256"),
            ),
            (
                "Ed25519",
                vec!["ED25519"],
                vec![
                    "pkeyutl", "-sign", "-inkey", "k.pem", "-rawin", "-in", "payload", "-out",
                    "sig",
                ],
            ),
            (
                "RSA",
                vec!["RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
                dgst("-sha256"),
            ),
        ];
        for (kind, generate, args) in keys {
            openssl(
                &[&["genpkey", "-out", "k.pem", "-algorithm"], &generate[..]].concat(),
                d,
            );
            openssl(&["pkey", "-in", "k.pem", "-pubout", "-out", "k.pub"], d);
            openssl(&args, d);
            let sig = STANDARD.encode(std::fs::read(d.join("sig")).unwrap_or_default());
            let public =
                PublicKey::load(&d.join("k.pub")).unwrap_or_else(|e| panic!("{kind}: {e}"));
            assert_eq!(public.kind, kind);
            assert!(
                public.verifies(PAYLOAD, &sig),
                "{kind}: OpenSSL's signature"
            );
            assert!(!public.verifies(b"{}", &sig), "{kind}: another payload");
            if kind == "ECDSA P-256" {
                // OpenSSL's PKCS#8 key signs here, and OpenSSL verifies what it signed.
                let pair = KeyPair::load(&d.join("k.pem"), b"").unwrap_or_else(|e| panic!("{e}"));
                let ours = pair.sign(PAYLOAD).unwrap_or_else(|e| panic!("{e}"));
                let der = STANDARD.decode(ours).unwrap_or_default();
                std::fs::write(d.join("ours"), der).unwrap_or_else(|e| panic!("{e}"));
                let ok = openssl(
                    &[
                        "dgst",
                        "-sha256",
                        "-verify",
                        "k.pub",
                        "-signature",
                        "ours",
                        "payload",
                    ],
                    d,
                );
                assert!(String::from_utf8_lossy(&ok).contains("Verified OK"));
            } else {
                // Only cosign's own kind of key signs.
                let refused = why(KeyPair::load(&d.join("k.pem"), b""));
                assert!(
                    refused.contains("cannot sign with this key"),
                    "{kind}: {refused}"
                );
            }
        }
    }

    #[test]
    fn hostile_and_mistaken_key_files_are_refused_with_reasons() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (private, public) = generate_key_pair(b"pw").unwrap_or_else(|e| panic!("{e}"));
        let block = pem_block(private.as_bytes()).unwrap_or_else(|| panic!("no PEM"));
        let sealed: serde_json::Value =
            serde_json::from_slice(&block.der).unwrap_or_else(|e| panic!("{e}"));
        let altered = |pointer: &str, value: serde_json::Value| {
            let mut v = sealed.clone();
            if let Some(slot) = v.pointer_mut(pointer) {
                *slot = value;
            }
            let text = pem_text(ENCRYPTED_LABELS[0], v.to_string().as_bytes());
            let name = format!("altered{}.key", pointer.replace('/', "-"));
            write(dir.path(), &name, text.as_bytes())
        };
        let cases = [
            // A cost of 2^22 would take 4 GiB and seconds before the password is even tried.
            (
                altered("/kdf/params/N", 4_194_304.into()),
                "unexpected scrypt cost N = 4194304",
            ),
            (
                altered("/kdf/params/r", 64.into()),
                "unexpected scrypt parameters r = 64",
            ),
            (
                altered("/kdf/name", "pbkdf2".into()),
                "encrypted with pbkdf2",
            ),
            (
                altered("/cipher/nonce", "AAAA".into()),
                "a nonce of 3 bytes",
            ),
            (
                altered("/ciphertext", "%%".into()),
                "the ciphertext is not base64",
            ),
            (
                write(dir.path(), "pub-as-key", public.as_bytes()),
                "expected cosign.key",
            ),
            (write(dir.path(), "empty", b""), "expected cosign.key"),
            (
                write(dir.path(), "cut", &private.as_bytes()[..200]),
                "expected cosign.key",
            ),
            (
                write(
                    dir.path(),
                    "sec1",
                    b"-----BEGIN EC PRIVATE KEY-----\nAA==\n-----END EC PRIVATE KEY-----\n",
                ),
                "`EC PRIVATE KEY` is not read",
            ),
        ];
        for (path, needle) in cases {
            let refused = why(KeyPair::load(&path, b"pw"));
            assert!(refused.contains(needle), "{}: {refused}", path.display());
            assert!(
                refused.starts_with(&path.display().to_string()),
                "{refused}"
            );
        }

        // Public keys: a private key, a curve ring does not check, bytes that are not DER.
        openssl(
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-521",
                "-out",
                "p521.pem",
            ],
            dir.path(),
        );
        openssl(
            &["pkey", "-in", "p521.pem", "-pubout", "-out", "p521.pub"],
            dir.path(),
        );
        let cases = [
            (
                write(dir.path(), "key-as-pub", private.as_bytes()),
                "not a PUBLIC KEY",
            ),
            (
                dir.path().join("p521.pub"),
                "an elliptic curve other than P-256 or P-384",
            ),
            (
                write(
                    dir.path(),
                    "junk.pub",
                    pem_text("PUBLIC KEY", b"junk").as_bytes(),
                ),
                "not a SubjectPublicKeyInfo",
            ),
        ];
        for (path, needle) in cases {
            let refused = why(PublicKey::load(&path));
            assert!(
                refused.contains("not a usable public key") && refused.contains(needle),
                "{refused}"
            );
        }
        let public = PublicKey::from_pem(public.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        assert!(!public.verifies(PAYLOAD, "not base64!"));
        assert!(!public.verifies(PAYLOAD, ""));
    }
}
