//! Image references as Docker reads them: `[registry[:port]/]path[:tag][@digest]`. A digest
//! is split at its `@`, never at the last `:` (which is inside the digest), and a registry's
//! port is not a tag.

/// One image reference, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// Registry and path, without tag or digest (`registry.example.com:5000/team/db`).
    pub repository: String,
    /// The tag, if written.
    pub tag: Option<String>,
    /// The digest (`sha256:...`), if written.
    pub digest: Option<String>,
}

impl Reference {
    /// Splits `image`; anything Docker would refuse is left for the engine to refuse.
    pub fn parse(image: &str) -> Reference {
        let (named, digest) = match image.split_once('@') {
            Some((named, digest)) => (named, Some(digest.to_string())),
            None => (image, None),
        };
        // A tag follows the last ':' only if no '/' comes after it (else it is a port).
        let (repository, tag) = match named.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => (repo, Some(tag.to_string())),
            _ => (named, None),
        };
        Reference {
            repository: repository.to_string(),
            tag,
            digest,
        }
    }

    /// What the engine's `POST /images/create` takes as `tag`: the digest when there is one
    /// (the engine pulls by digest then), else the tag, else `latest`.
    pub fn pull_tag(&self) -> String {
        self.digest
            .clone()
            .or_else(|| self.tag.clone())
            .unwrap_or_else(|| "latest".to_string())
    }

    /// The registry that serves it: the first path component when it names a host
    /// (has a `.` or `:`, or is `localhost`), else Docker Hub.
    pub fn registry(&self) -> String {
        match self.repository.split_once('/') {
            Some((first, _))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                first.to_string()
            }
            _ => "docker.io".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn references_split_as_docker_splits_them() {
        let cases = [
            ("alpine", "alpine", None, None, "latest", "docker.io"),
            (
                "alpine:3.20",
                "alpine",
                Some("3.20"),
                None,
                "3.20",
                "docker.io",
            ),
            (
                "registry.example.com:5000/team/db",
                "registry.example.com:5000/team/db",
                None,
                None,
                "latest",
                "registry.example.com:5000",
            ),
            (
                "localhost/x:1",
                "localhost/x",
                Some("1"),
                None,
                "1",
                "localhost",
            ),
        ];
        for (image, repository, tag, digest, pull, registry) in cases {
            let r = Reference::parse(image);
            assert_eq!(r.repository, repository, "{image}");
            assert_eq!(r.tag.as_deref(), tag, "{image}");
            assert_eq!(r.digest.as_deref(), digest, "{image}");
            assert_eq!(r.pull_tag(), pull, "{image}");
            assert_eq!(r.registry(), registry, "{image}");
        }
    }

    #[test]
    fn a_digest_is_pulled_by_digest_with_or_without_a_tag() {
        for image in [
            format!("127.0.0.1:5000/ci/busybox@{DIGEST}"),
            format!("127.0.0.1:5000/ci/busybox:1@{DIGEST}"),
        ] {
            let r = Reference::parse(&image);
            assert_eq!(r.repository, "127.0.0.1:5000/ci/busybox", "{image}");
            assert_eq!(r.pull_tag(), DIGEST, "{image}");
            assert_eq!(r.registry(), "127.0.0.1:5000");
        }
    }
}
