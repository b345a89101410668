//! The user a client certificate names, read as the API server reads it: the subject's common
//! name is the user (the last one, if several), each organization a group. The certificate is
//! parsed with `x509-parser`; attribute values are read in the string types Go's `crypto/x509`
//! reads (UTF8String, PrintableString, IA5String, NumericString, T61String and BMPString).
//!
//! Not verification: a certificate reaches this only after rustls verified it against the client
//! CA during the TLS handshake.

use x509_parser::asn1_rs::{Any, Tag};
use x509_parser::certificate::X509Certificate;
use x509_parser::oid_registry::{OID_X509_COMMON_NAME, OID_X509_ORGANIZATION_NAME};
use x509_parser::prelude::FromDer;

/// The subject's common name and organizations of a DER certificate; `None` when it cannot be
/// parsed or has no common name (the API server does not authenticate such a certificate).
pub(crate) fn subject(cert: &[u8]) -> Option<(String, Vec<String>)> {
    let (_, cert) = X509Certificate::from_der(cert).ok()?;
    let (mut common_name, mut organizations) = (None, Vec::new());
    for attribute in cert.subject().iter_attributes() {
        let kind = attribute.attr_type();
        if *kind == OID_X509_COMMON_NAME {
            common_name = text(attribute.attr_value()).or(common_name);
        } else if *kind == OID_X509_ORGANIZATION_NAME {
            organizations.extend(text(attribute.attr_value()));
        }
    }
    common_name
        .filter(|cn| !cn.is_empty())
        .map(|cn| (cn, organizations))
}

/// The text of a string value; `None` for other types and malformed contents.
fn text(value: &Any<'_>) -> Option<String> {
    let bytes = value.as_bytes();
    match value.tag() {
        Tag::Utf8String | Tag::PrintableString | Tag::Ia5String | Tag::NumericString => {
            std::str::from_utf8(bytes).ok().map(str::to_owned)
        }
        // Go reads T61String's bytes as they are; as text they are Latin-1 at best.
        Tag::T61String => Some(bytes.iter().copied().map(char::from).collect()),
        Tag::BmpString => {
            if !bytes.len().is_multiple_of(2) {
                return None;
            }
            let units = bytes
                .chunks_exact(2)
                .map(|pair| u16::from_be_bytes([pair[0], pair[1]]));
            char::decode_utf16(units)
                .collect::<Result<String, _>>()
                .ok()
        }
        _ => None,
    }
}

#[cfg(test)]
#[path = "x509_tests.rs"]
mod tests;
