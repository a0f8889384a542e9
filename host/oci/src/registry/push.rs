//! Pushing: blobs and manifests uploaded for an artifact, and cosign signatures stored under
//! the `sha256-<hex>.sig` tag beside the ones already there.

use crate::artifact::{self, PushAnnotations, digest_of};
use crate::keys::KeyPair;
use crate::signature::{self, Descriptor, SignatureManifest};
use crate::{OciError, OciRef};

use super::Registry;

impl Registry {
    /// Pushes a validated component under `r` (which needs a tag); returns the manifest digest.
    pub async fn push(
        &self,
        wasm: &[u8],
        file_name: &str,
        world: &str,
        r: &OciRef,
        annotations: PushAnnotations,
    ) -> Result<String, OciError> {
        let Some(tag) = r.tag.clone() else {
            return Err(OciError::BadReference {
                reference: r.to_string(),
                why: "push needs a :tag to publish under".to_string(),
            });
        };
        let created = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let annotations = annotations.with_defaults(file_name, Some(&tag), &created);
        let built = artifact::build(wasm, file_name, world, &annotations)?;
        if let Some(d) = &r.digest
            && d != &built.manifest_digest
        {
            return Err(OciError::BadReference {
                reference: r.to_string(),
                why: format!(
                    "the pushed manifest would be {}, not {d}",
                    built.manifest_digest
                ),
            });
        }
        let (client, auth) = self.client(r)?;
        let target = r.at_tag(&tag);
        client
            .auth(
                &target.client_ref(),
                &auth,
                oci_client::RegistryOperation::Push,
            )
            .await
            .map_err(|e| self.map_err(&target, true, e))?;
        for (bytes, digest) in [
            (built.config.clone(), built.config_digest.clone()),
            (wasm.to_vec(), built.layer_digest.clone()),
        ] {
            self.upload_blob(&client, &target, bytes, &digest).await?;
        }
        self.put_manifest(&client, &target, built.manifest).await?;
        Ok(built.manifest_digest)
    }

    pub(super) async fn upload_blob(
        &self,
        client: &oci_client::Client,
        target: &OciRef,
        bytes: Vec<u8>,
        digest: &str,
    ) -> Result<(), OciError> {
        let exists = client
            .blob_exists(&target.client_ref(), digest)
            .await
            .map_err(|e| self.map_err(target, true, e))?;
        if !exists {
            client
                .push_blob(&target.client_ref(), bytes, digest)
                .await
                .map_err(|e| self.map_err(target, true, e))?;
        }
        Ok(())
    }

    pub(super) async fn put_manifest(
        &self,
        client: &oci_client::Client,
        target: &OciRef,
        manifest: Vec<u8>,
    ) -> Result<(), OciError> {
        client
            .push_manifest_raw(
                &target.client_ref(),
                manifest,
                http::HeaderValue::from_static(artifact::MANIFEST_MEDIA_TYPE),
            )
            .await
            .map_err(|e| self.map_err(target, true, e))?;
        Ok(())
    }

    /// Signs the manifest `r` resolves to and stores the signature under `sha256-<hex>.sig`.
    pub async fn sign(&self, r: &OciRef, key: &KeyPair) -> Result<(String, String), OciError> {
        let (client, auth) = self.client(r)?;
        let (_, check) = self.fetch_manifest(&client, &auth, r).await?;
        let digest = check.digest;
        let payload = signature::payload(&r.repo_name(), &digest);
        let sig = key.sign(&payload).map_err(|why| OciError::Signature {
            reference: r.to_string(),
            why,
        })?;
        let pinned = r.pinned(&digest);
        let tag = signature::signature_tag(&digest);
        let sig_ref = pinned.at_tag(&tag);
        client
            .auth(
                &sig_ref.client_ref(),
                &auth,
                oci_client::RegistryOperation::Push,
            )
            .await
            .map_err(|e| self.map_err(&sig_ref, true, e))?;
        // Keep signatures already there (other keys), replacing an identical payload's entry.
        let mut layers: Vec<Descriptor> = match self
            .manifest_bytes(&client, &auth, &sig_ref, &[artifact::MANIFEST_MEDIA_TYPE])
            .await
        {
            Ok(bytes) => serde_json::from_slice::<SignatureManifest>(&bytes)
                .map(|m| m.layers)
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        let payload_digest = digest_of(&payload);
        layers.retain(|l| l.signature() != Some(sig.as_str()));
        layers.push(Descriptor {
            media_type: signature::SIMPLESIGNING_MEDIA_TYPE.to_string(),
            digest: payload_digest.clone(),
            size: payload.len() as u64,
            annotations: [(signature::SIGNATURE_ANNOTATION.to_string(), sig.clone())].into(),
            extra: serde_json::Map::new(),
        });
        let diff_ids: Vec<String> = layers.iter().map(|l| l.digest.clone()).collect();
        let config = signature::signature_config(&diff_ids);
        let config_digest = digest_of(&config);
        self.upload_blob(&client, &sig_ref, payload, &payload_digest)
            .await?;
        self.upload_blob(&client, &sig_ref, config.clone(), &config_digest)
            .await?;
        let manifest = SignatureManifest {
            schema_version: 2,
            media_type: Some(artifact::MANIFEST_MEDIA_TYPE.to_string()),
            config: Some(Descriptor {
                media_type: signature::SIGNATURE_CONFIG_MEDIA_TYPE.to_string(),
                digest: config_digest,
                size: config.len() as u64,
                annotations: Default::default(),
                extra: serde_json::Map::new(),
            }),
            layers,
        };
        let bytes =
            serde_json::to_vec(&manifest).map_err(|e| OciError::local(self.store.root(), e))?;
        self.put_manifest(&client, &sig_ref, bytes).await?;
        Ok((digest, tag))
    }
}
