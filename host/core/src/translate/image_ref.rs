//! Image references by the distribution grammar (`distribution/reference`, which the OCI
//! distribution spec and every registry client follow), checked by hand:
//!
//! ```text
//! reference        := name [ ":" tag ] [ "@" digest ]
//! name             := [ domain "/" ] path-component ( "/" path-component )*
//! domain           := host [ ":" port ]            host := domain-name | "[" ipv6 "]"
//! domain-name      := component ( "." component )* component := [a-zA-Z0-9] | [a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]
//! path-component   := [a-z0-9]+ ( separator [a-z0-9]+ )*   separator := "." | "_" | "__" | "-"+
//! tag              := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
//! digest           := algorithm ":" hex{32,}       algorithm := [A-Za-z][A-Za-z0-9]* ( [-_+.] [A-Za-z][A-Za-z0-9]* )*
//! ```
//!
//! The name is at most 255 characters, and a digest is one of the OCI image spec's registered
//! algorithms with its exact length (sha256: 64, sha384: 96, sha512: 128 hex digits).
//! `[ipv6]` registries are accepted, as the grammar allows since distribution 2.8. The `oci-spec` crate checks the same with a regular expression whose compiled form
//! held about 7 MiB of the node's heap for as long as it ran (its `\w` is Unicode's).

const INVALID: &str = "invalid reference format";

/// Why `image` is not a reference by the grammar above, or `None`.
pub(crate) fn reference_error(image: &str) -> Option<&'static str> {
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    if let Some(digest) = digest
        && let Some(why) = digest_error(digest)
    {
        return Some(why);
    }
    // A tag follows the last ':' after the last '/' (a ':' before it is the registry's port).
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if tag.is_some_and(|t| !is_tag(t)) || !is_name(name) {
        return Some(INVALID);
    }
    if name.len() > 255 {
        return Some("repository name must not be more than 255 characters");
    }
    None
}

fn is_name(name: &str) -> bool {
    let path_ok = |path: &str| path.split('/').all(is_path_component);
    if path_ok(name) {
        return true;
    }
    name.split_once('/')
        .is_some_and(|(domain, path)| is_domain(domain) && path_ok(path))
}

fn is_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        // A separator: '.', '_', '__', or a run of '-', between alphanumerics.
        let start = i;
        match b[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if b.get(i) == Some(&b'_') {
                    i += 1;
                }
            }
            b'-' => {
                while b.get(i) == Some(&b'-') {
                    i += 1;
                }
            }
            _ => return false,
        }
        if i == start || !b.get(i).copied().is_some_and(alnum) {
            return false;
        }
    }
    true
}

fn is_domain(domain: &str) -> bool {
    // `[ipv6]` or a dotted host name, then an optional `:port`.
    let (host_ok, port) = match domain.strip_prefix('[') {
        Some(after) => {
            let Some((v6, rest)) = after.split_once(']') else {
                return false;
            };
            let port = match rest {
                "" => None,
                _ => match rest.strip_prefix(':') {
                    Some(port) => Some(port),
                    None => return false,
                },
            };
            let v6_ok = !v6.is_empty() && v6.bytes().all(|x| x.is_ascii_hexdigit() || x == b':');
            (v6_ok, port)
        }
        None => {
            let (host, port) = match domain.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (domain, None),
            };
            (host.split('.').all(is_domain_component), port)
        }
    };
    host_ok && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|x| x.is_ascii_digit()))
}

fn is_domain_component(c: &str) -> bool {
    let b = c.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'-')
}

fn is_tag(tag: &str) -> bool {
    let word = |x: u8| x.is_ascii_alphanumeric() || x == b'_';
    let b = tag.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && word(b[0])
        && b.iter().all(|x| word(*x) || *x == b'.' || *x == b'-')
}

fn digest_error(digest: &str) -> Option<&'static str> {
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return Some(INVALID);
    };
    let component_ok = |c: &str| {
        let b = c.as_bytes();
        !b.is_empty() && b[0].is_ascii_alphabetic() && b.iter().all(u8::is_ascii_alphanumeric)
    };
    let algorithm_ok = algorithm.split(['-', '_', '+', '.']).all(component_ok);
    if !algorithm_ok || hex.len() < 32 || !hex.bytes().all(|x| x.is_ascii_hexdigit()) {
        return Some(INVALID);
    }
    let exact = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return Some("unsupported digest algorithm (sha256, sha384 or sha512)"),
    };
    if hex.len() != exact {
        return Some("invalid digest length");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::reference_error;

    /// Pieces that references are made of, and the ones that break them.
    const PIECES: &[&str] = &[
        "a",
        "b1",
        "z",
        "0",
        "ubuntu",
        "x9y",
        "A",
        "Ab",
        "-",
        "--",
        ".",
        "_",
        "__",
        "___",
        "/",
        "//",
        ":",
        "::",
        "@",
        "[",
        "]",
        "[::1]",
        "localhost",
        "reg.io",
        "reg-x.io",
        ":5000",
        ":5x",
        "sha256:",
        "sha512:",
        "md5:",
        "0123456789abcdef0123456789abcdef",
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "ABCDEF",
        " ",
        "\n",
        "\t",
        "$",
        "é",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]
        /// The hand-written check agrees with oci-spec's regular expression on ASCII input
        /// without an IPv6 registry (oci-spec's tag class `\w` is Unicode's, the grammar's and
        /// this one's ASCII; its grammar predates IPv6 registries, which this one accepts).
        #[test]
        fn agrees_with_oci_spec(parts in proptest::collection::vec(0..PIECES.len(), 1..8)) {
            let image: String = parts.iter().map(|i| PIECES[*i]).collect();
            let theirs = image.parse::<oci_spec::distribution::Reference>();
            let ours = reference_error(&image);
            if !image.is_ascii() {
                proptest::prop_assert!(ours.is_some(), "{:?} was accepted", image);
            } else if !image.contains('[') {
                proptest::prop_assert_eq!(ours.is_none(), theirs.is_ok(), "{:?}: ours {:?}, oci-spec {:?}", image, ours, theirs.err());
            }
        }
    }

    #[test]
    fn references_registries_use_are_accepted() {
        let sha = "a".repeat(64);
        for ok in [
            "ubuntu",
            "ubuntu:22.04",
            "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime",
            "nvcr.io/nvidia/pytorch:24.05-py3",
            "localhost:5000/team/trainer:v1",
            "registry.example.com:443/a/b/c",
            "Registry.Example.COM/lower/name",
            "[::1]:5000/img",
            "[fe80::1]/img:tag",
            "ghcr.io/org/my_image__x.y-z---w:Tag_1.0-rc",
            &format!("ubuntu@sha256:{sha}"),
            &format!("ubuntu:22.04@sha256:{sha}"),
            &format!("img@sha512:{}", "F".repeat(128)),
            "a",
            "0",
        ] {
            assert_eq!(reference_error(ok), None, "{ok:?}");
        }
    }

    #[test]
    fn anything_else_is_refused() {
        let long = format!("registry.io/{}", "a".repeat(250));
        for bad in [
            "",
            "--privileged",
            "ubuntu --network=host",
            "ubuntu\nsh",
            "PyTorch/PyTorch",
            "ubuntu:",
            "ubuntu:-tag",
            ":tag",
            "/ubuntu",
            "ubuntu/",
            "a//b",
            "a..b",
            "a___b",
            "a-",
            "-a",
            "reg.io:/a",
            "reg.io:5x/a",
            "-reg.io/a",
            "[::1/a",
            "[]/a",
            "[::1]x/a",
            "ubuntu@sha256:abc",
            "ubuntu@sha256",
            "ubuntu@:0123456789abcdef0123456789abcdef",
            "ubuntu@1sha:0123456789abcdef0123456789abcdef",
            "img@md5:0123456789abcdef0123456789abcdef",
            &format!("ubuntu@sha384:{}", "a".repeat(64)),
            &format!("ubuntu@sha256:{}", "a".repeat(63)),
            &format!("ubuntu:{}", "t".repeat(129)),
            "ubuntu:tag@",
            "ubuntu:é",
            "ubüntu",
            &long,
        ] {
            assert!(reference_error(bad).is_some(), "{bad:?} was accepted");
        }
    }
}
