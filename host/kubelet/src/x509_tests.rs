use rcgen::string::BmpString;
use rcgen::{CertificateParams, DnType, DnValue, KeyPair};
use x509_parser::prelude::FromDer;

use super::*;

fn cert(cn: Option<DnValue>, org: Option<&str>) -> Vec<u8> {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    if let Some(cn) = cn {
        params.distinguished_name.push(DnType::CommonName, cn);
    }
    if let Some(org) = org {
        params
            .distinguished_name
            .push(DnType::OrganizationName, org);
    }
    let key = KeyPair::generate().expect("key");
    params.self_signed(&key).expect("cert").der().to_vec()
}

fn utf8(s: &str) -> Option<DnValue> {
    Some(DnValue::Utf8String(s.into()))
}

#[test]
fn the_common_name_is_the_user_and_the_organization_a_group() {
    let der = cert(
        utf8("kube-apiserver-kubelet-client"),
        Some("system:masters"),
    );
    let (user, groups) = subject(&der).expect("subject");
    assert_eq!(user, "kube-apiserver-kubelet-client");
    assert_eq!(groups, ["system:masters"]);
}

#[test]
fn a_bmp_string_common_name_is_read_as_go_reads_it() {
    let name = BmpString::try_from("system:node:gpü-1").expect("bmp");
    let der = cert(Some(DnValue::BmpString(name)), None);
    let (user, groups) = subject(&der).expect("subject");
    assert_eq!(user, "system:node:gpü-1");
    assert!(groups.is_empty());
}

/// A DER element.
fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    match content.len() {
        n if n < 0x80 => out.push(n as u8),
        n if n < 0x100 => out.extend([0x81, n as u8]),
        n => out.extend([0x82, (n >> 8) as u8, n as u8]),
    }
    out.extend_from_slice(content);
    out
}

/// One attribute in its own RDN.
fn attribute(oid: &[u8], tag: u8, value: &[u8]) -> Vec<u8> {
    let pair = [tlv(0x06, oid), tlv(tag, value)].concat();
    tlv(0x31, &tlv(0x30, &pair))
}

const CN: &[u8] = &[0x55, 0x04, 0x03];
const O: &[u8] = &[0x55, 0x04, 0x0a];

/// An rcgen certificate whose subject is replaced by `rdns` (rcgen keeps one value per attribute
/// type, so several organizations are written by hand); the issuer stays the original.
fn with_subject(rdns: &[Vec<u8>]) -> Vec<u8> {
    let der = cert(utf8("placeholder"), None);
    let (_, parsed) = X509Certificate::from_der(&der).expect("parse");
    let tbs: &[u8] = parsed.tbs_certificate.as_ref();
    let old = parsed.subject().as_raw();
    let at = tbs
        .windows(old.len())
        .rposition(|w| w == old)
        .expect("the subject inside the TBS");
    let header = tbs.len() - body_len(tbs);
    let body = [
        &tbs[header..at],
        &tlv(0x30, &rdns.concat()),
        &tbs[at + old.len()..],
    ]
    .concat();
    let offset = der.len() - body_len(&der);
    let rest = &der[offset + tbs.len()..];
    tlv(0x30, &[tlv(0x30, &body), rest.to_vec()].concat())
}

/// The length of a DER element's contents (the element spans the whole slice).
fn body_len(element: &[u8]) -> usize {
    let (_, any) = Any::from_der(element).expect("element");
    any.as_bytes().len()
}

#[test]
fn every_organization_is_a_group_and_the_last_common_name_the_user() {
    let der = with_subject(&[
        attribute(O, 0x13, b"system:nodes"),
        attribute(CN, 0x0c, b"first"),
        attribute(CN, 0x0c, b"system:node:gpu-1"),
        attribute(O, 0x14, b"t\xe9am-a"),
        attribute(O, 0x1e, &[0x00, 0x62, 0x00, 0x6d]),
    ]);
    let (user, groups) = subject(&der).expect("subject");
    assert_eq!(user, "system:node:gpu-1");
    assert_eq!(groups, ["system:nodes", "téam-a", "bm"]);
}

#[test]
fn values_of_other_types_or_malformed_text_name_nobody() {
    // An odd-length BMPString, invalid UTF-8 in a UTF8String, an OCTET STRING.
    for value in [
        attribute(CN, 0x1e, &[0x00, 0x62, 0x00]),
        attribute(CN, 0x0c, &[0xff, 0xfe]),
        attribute(CN, 0x04, b"alice"),
    ] {
        let der = with_subject(&[value, attribute(O, 0x0c, b"system:masters")]);
        assert_eq!(subject(&der), None);
    }
}

#[test]
fn a_certificate_without_a_common_name_names_nobody() {
    assert_eq!(subject(&cert(None, Some("system:masters"))), None);
    assert_eq!(subject(&cert(utf8(""), Some("system:masters"))), None);
}

#[test]
fn truncated_or_garbage_input_names_nobody() {
    let der = cert(utf8("alice"), None);
    for len in [0, 1, 10, der.len() / 2, der.len() - 1] {
        assert_eq!(subject(&der[..len]), None, "first {len} bytes");
    }
    assert_eq!(subject(b"not a certificate"), None);
}
