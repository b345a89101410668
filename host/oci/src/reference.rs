//! Where an artifact lives: `<registry>/<repository>[:<tag>][@sha256:<hex>]`, with the registry
//! named explicitly (no implicit Docker Hub), and pinned by digest where the node loads it.

use oci_client::Reference;

use crate::OciError;

/// A parsed artifact reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRef(Reference);

impl PolicyRef {
    /// Parses `text`, which must name its registry host (`registry.example.com/team/policy`,
    /// `127.0.0.1:5000/policy`, `localhost/policy`).
    pub fn parse(text: &str) -> Result<Self, OciError> {
        let refused = |message: String| OciError::Reference {
            reference: text.to_owned(),
            message,
        };
        let first = text.split('/').next().unwrap_or_default();
        let names_registry = text.contains('/')
            && (first.contains('.') || first.contains(':') || first == "localhost");
        if !names_registry {
            return Err(refused(
                "names no registry host: write <registry>/<repository>, for example \
                 registry.example.com/team/policy"
                    .into(),
            ));
        }
        let reference: Reference = text
            .parse()
            .map_err(|e| refused(format!("is not an OCI reference: {e}")))?;
        if let Some(digest) = reference.digest() {
            let hex = digest.strip_prefix("sha256:").unwrap_or_default();
            let valid =
                hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
            if !valid {
                return Err(refused(format!(
                    "has digest {digest:?}; only sha256:<64 lower-case hex digits> is accepted"
                )));
            }
        }
        Ok(Self(reference))
    }

    /// Parses `text` and requires a digest: a tag can be moved to other bytes, so the node
    /// loads only what a digest names.
    pub fn pinned(text: &str) -> Result<Self, OciError> {
        let reference = Self::parse(text)?;
        if reference.digest().is_none() {
            return Err(OciError::Reference {
                reference: text.to_owned(),
                message: "has no digest: a tag can be moved to other bytes, so name the \
                          artifact as <registry>/<repository>@sha256:<digest> (what `policy \
                          push` prints)"
                    .into(),
            });
        }
        Ok(reference)
    }

    /// The registry host (and port).
    pub fn registry(&self) -> &str {
        self.0.registry()
    }

    /// The repository inside the registry.
    pub fn repository(&self) -> &str {
        self.0.repository()
    }

    /// `sha256:<hex>`, if the reference has one.
    pub fn digest(&self) -> Option<&str> {
        self.0.digest()
    }

    /// The tag, if the reference has one.
    pub fn tag(&self) -> Option<&str> {
        self.0.tag()
    }

    /// The same repository at `digest`, without a tag.
    pub fn at_digest(&self, digest: &str) -> Self {
        Self(Reference::with_digest(
            self.registry().to_owned(),
            self.repository().to_owned(),
            digest.to_owned(),
        ))
    }

    /// The same repository at `tag`.
    pub(crate) fn at_tag(&self, tag: &str) -> Self {
        Self(Reference::with_tag(
            self.registry().to_owned(),
            self.repository().to_owned(),
            tag.to_owned(),
        ))
    }

    /// `<registry>/<repository>`: the identity a signature names.
    pub fn repository_name(&self) -> String {
        format!("{}/{}", self.registry(), self.repository())
    }

    /// The tag cosign stores the signatures of `digest` under: `sha256-<hex>.sig`.
    pub(crate) fn signature_tag(digest: &str) -> String {
        format!("{}.sig", digest.replacen(':', "-", 1))
    }

    pub(crate) fn inner(&self) -> &Reference {
        &self.0
    }
}

impl std::fmt::Display for PolicyRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.whole())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_pinned_reference_keeps_registry_repository_and_digest() {
        let text = format!("127.0.0.1:5000/team/fallback@{DIGEST}");
        let r = PolicyRef::pinned(&text).unwrap();
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.repository(), "team/fallback");
        assert_eq!(r.digest(), Some(DIGEST));
        assert_eq!(r.to_string(), text);
        assert_eq!(
            PolicyRef::signature_tag(DIGEST),
            "sha256-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.sig"
        );
        let tagged = PolicyRef::parse("registry.example.com/p:v1").unwrap();
        assert_eq!(tagged.tag(), Some("v1"));
        assert_eq!(
            tagged.at_digest(DIGEST).to_string(),
            format!("registry.example.com/p@{DIGEST}")
        );
    }

    #[test]
    fn a_tag_alone_an_implicit_registry_or_a_bad_digest_is_refused_by_name() {
        let cases = [
            (
                "registry.example.com/team/fallback:v1",
                true,
                "has no digest",
            ),
            ("registry.example.com/team/fallback", true, "has no digest"),
            ("team/fallback@sha256:00", false, "names no registry host"),
            ("fallback", false, "names no registry host"),
            (
                "registry.example.com/p@sha256:ABC",
                false,
                "is not an OCI reference",
            ),
            (
                "registry.example.com/p@sha512:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                false,
                "only sha256:<64",
            ),
            (
                "registry.example.com/p@md5:0123",
                false,
                "is not an OCI reference",
            ),
            (
                "registry.example.com/UPPER@sha256:00",
                false,
                "is not an OCI reference",
            ),
        ];
        for (text, parses, why) in cases {
            let pinned = PolicyRef::pinned(text).expect_err(text).to_string();
            assert!(pinned.contains(why), "{text}: {pinned}");
            assert!(pinned.contains(&format!("{text:?}")), "{text}: {pinned}");
            assert_eq!(PolicyRef::parse(text).is_ok(), parses, "{text}");
        }
    }
}
