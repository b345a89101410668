//! The user a client certificate names, read as the API server reads it: the subject's common
//! name is the user, each organization a group. A minimal DER walk over the subject of a
//! certificate that rustls has already verified against the client CA.
//!
//! Not verification: a certificate reaches this only after its TLS handshake succeeded.

/// `id-at-commonName` (2.5.4.3), DER-encoded.
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// `id-at-organizationName` (2.5.4.10), DER-encoded.
const ORGANIZATION: &[u8] = &[0x55, 0x04, 0x0a];

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const VERSION: u8 = 0xa0;

/// The subject's common name and organizations of a DER certificate; `None` when it cannot be
/// read or has no common name (the API server does not authenticate such a certificate).
pub(crate) fn subject(cert: &[u8]) -> Option<(String, Vec<String>)> {
    let certificate = Der(cert).expect(SEQUENCE)?;
    let mut tbs = Der(Der(certificate).expect(SEQUENCE)?);
    if tbs.0.first() == Some(&VERSION) {
        tbs.next()?;
    }
    for _ in ["serial", "signature", "issuer", "validity"] {
        tbs.next()?;
    }
    let mut name = Der(tbs.expect(SEQUENCE)?);
    let (mut common_name, mut organizations) = (None, Vec::new());
    while !name.0.is_empty() {
        let mut rdn = Der(name.expect(SET)?);
        while !rdn.0.is_empty() {
            let mut attribute = Der(rdn.expect(SEQUENCE)?);
            let oid = attribute.expect(OID)?;
            let value = text(attribute.next()?);
            match (oid, value) {
                (COMMON_NAME, Some(v)) => common_name = Some(v),
                (ORGANIZATION, Some(v)) => organizations.push(v),
                _ => {}
            }
        }
    }
    common_name
        .filter(|cn| !cn.is_empty())
        .map(|cn| (cn, organizations))
}

/// The text of a UTF8String, PrintableString, T61String or IA5String.
fn text((tag, value): (u8, &[u8])) -> Option<String> {
    matches!(tag, 0x0c | 0x13 | 0x14 | 0x16).then(|| String::from_utf8_lossy(value).into_owned())
}

/// DER elements one after another.
struct Der<'a>(&'a [u8]);

impl<'a> Der<'a> {
    /// The next element's tag and contents.
    fn next(&mut self) -> Option<(u8, &'a [u8])> {
        let (&tag, rest) = self.0.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            let (len, rest) = rest.split_at(n);
            let len = len
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
            (len, rest)
        };
        if rest.len() < len {
            return None;
        }
        let (value, rest) = rest.split_at(len);
        self.0 = rest;
        Some((tag, value))
    }

    /// The contents of the next element, which must have `tag`.
    fn expect(&mut self, tag: u8) -> Option<&'a [u8]> {
        self.next().filter(|(t, _)| *t == tag).map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, DnType, KeyPair};

    use super::*;

    fn cert(cn: Option<&str>, orgs: &[&str]) -> Vec<u8> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        for org in orgs {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *org);
        }
        let key = KeyPair::generate().expect("key");
        params.self_signed(&key).expect("cert").der().to_vec()
    }

    #[test]
    fn the_common_name_is_the_user_and_the_organization_a_group() {
        let der = cert(Some("kube-apiserver-kubelet-client"), &["system:masters"]);
        let (user, groups) = subject(&der).expect("subject");
        assert_eq!(user, "kube-apiserver-kubelet-client");
        assert_eq!(groups, ["system:masters"]);
    }

    fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        match content.len() {
            n if n < 0x80 => out.push(n as u8),
            n => out.extend([0x82, (n >> 8) as u8, n as u8]),
        }
        out.extend_from_slice(content);
        out
    }

    fn attribute(oid: &[u8], tag: u8, value: &str) -> Vec<u8> {
        let pair = [tlv(OID, oid), tlv(tag, value.as_bytes())].concat();
        tlv(SET, &tlv(SEQUENCE, &pair))
    }

    /// rcgen keeps one value per attribute type, so a subject with several organizations (and
    /// the issuer's common name before it) is written by hand.
    #[test]
    fn every_organization_is_a_group_and_the_issuer_is_not_the_subject() {
        let issuer = tlv(SEQUENCE, &attribute(COMMON_NAME, 0x0c, "the-ca"));
        let subject_name = [
            attribute(ORGANIZATION, 0x13, "system:nodes"),
            attribute(COMMON_NAME, 0x0c, "system:node:gpu-1"),
            attribute(ORGANIZATION, 0x0c, "team-a"),
        ]
        .concat();
        let tbs = [
            tlv(VERSION, &tlv(0x02, &[2])),
            tlv(0x02, &[1]),
            tlv(SEQUENCE, &[]),
            issuer,
            tlv(SEQUENCE, &[]),
            tlv(SEQUENCE, &subject_name),
            tlv(SEQUENCE, &[0; 300]),
        ]
        .concat();
        let der = tlv(SEQUENCE, &tlv(SEQUENCE, &tbs));
        let (user, groups) = subject(&der).expect("subject");
        assert_eq!(user, "system:node:gpu-1");
        assert_eq!(groups, ["system:nodes", "team-a"]);
    }

    #[test]
    fn a_certificate_without_a_common_name_names_nobody() {
        assert_eq!(subject(&cert(None, &["system:masters"])), None);
    }

    #[test]
    fn truncated_or_garbage_input_names_nobody() {
        let der = cert(Some("alice"), &[]);
        for len in [0, 1, 10, der.len() / 2] {
            assert_eq!(subject(&der[..len]), None, "first {len} bytes");
        }
        assert_eq!(subject(b"not a certificate"), None);
    }
}
