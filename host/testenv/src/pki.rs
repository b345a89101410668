//! The control plane's PKI, generated in Rust: a real CA (not a self-signed leaf, which rustls
//! refuses as a trust anchor), a serving certificate for every component, client certificates for
//! any identity a test needs, and the service-account signing key.
//!
//! It is not a general-purpose CA: keys live in memory and in the control plane's directory, and
//! everything is valid for one year, which outlives any test run.

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

use crate::Error;

/// A certificate and its private key, both PEM.
#[derive(Clone)]
pub struct CertPair {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key, PKCS#8 PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for CertPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertPair")
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// The certificate authority that signs every certificate of one control plane.
pub struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").finish_non_exhaustive()
    }
}

fn pki_err(what: &str) -> impl FnOnce(rcgen::Error) -> Error + '_ {
    move |source| Error::Pki {
        what: what.to_owned(),
        source,
    }
}

impl Pki {
    /// Generates a new CA key and self-signed CA certificate.
    pub fn new() -> Result<Self, Error> {
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "neocloud-testenv-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().map_err(pki_err("ca key"))?;
        let ca = CertifiedIssuer::self_signed(params, key).map_err(pki_err("ca certificate"))?;
        Ok(Self { ca })
    }

    /// The CA certificate, PEM: the trust anchor for every client and server.
    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// A serving certificate for loopback: `localhost`, the in-cluster names of the API server,
    /// 127.0.0.1, and the `kubernetes` Service's address (10.0.0.1, the first of the control
    /// plane's `--service-cluster-ip-range`), which Pods dial as `KUBERNETES_SERVICE_HOST`.
    pub fn serving(&self, common_name: &str) -> Result<CertPair, Error> {
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.subject_alt_names = ["localhost", "kubernetes", "kubernetes.default"]
            .into_iter()
            .chain([
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ])
            .map(|n| n.try_into().map(SanType::DnsName))
            .collect::<Result<_, _>>()
            .map_err(pki_err("serving certificate names"))?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params, "serving certificate")
    }

    /// A client certificate whose subject is `CN=user, O=group...`, which is how the API server
    /// derives the user name and groups of a certificate-authenticated caller.
    pub fn client(&self, user: &str, groups: &[&str]) -> Result<CertPair, Error> {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params, "client certificate")
    }

    fn sign(&self, mut params: CertificateParams, what: &str) -> Result<CertPair, Error> {
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().map_err(pki_err(what))?;
        let cert = params.signed_by(&key, &self.ca).map_err(pki_err(what))?;
        Ok(CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// The key pair that signs and verifies service-account tokens: (private PEM, public PEM).
pub fn service_account_key() -> Result<(String, String), Error> {
    let key = KeyPair::generate().map_err(pki_err("service account key"))?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}
