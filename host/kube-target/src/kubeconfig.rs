//! What a remote cluster's kubeconfig may contain. The kubeconfig comes from a Secret (written by
//! whoever may write Secrets in the node's namespace, or by NVKE for its workload clusters), yet
//! kube-rs acts on it inside the node: an `exec` plugin or an `auth-provider`'s command would run
//! there, and a file path (`tokenFile: /var/run/secrets/.../token` with an attacker's `server`)
//! would hand the node's own credentials to someone else. So only inline material is accepted:
//! `server`, `certificate-authority-data`, `token`, `client-certificate-data`, `client-key-data`,
//! `username`/`password`, impersonation and `tls-server-name`. `insecure-skip-tls-verify: true`
//! is refused unless the cluster's configuration allows it.
//!
//! Every user and cluster entry is checked, not only those of the current context, so that what
//! is accepted does not depend on which context is chosen. Not how a client is built from it
//! ([`crate::client_from_kubeconfig`]).

use kube::config::{AuthInfo, Cluster, Kubeconfig};

/// A kubeconfig field the node refuses, and where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{entry} sets {field:?}, which is refused: {why}")]
pub struct KubeconfigRefused {
    /// The entry, e.g. `users["admin"]` or `clusters["west"]`.
    pub entry: String,
    /// The kubeconfig field, e.g. `exec` or `tokenFile`.
    pub field: &'static str,
    /// Why it is refused, and what to use instead.
    pub why: &'static str,
}

const RUNS_A_COMMAND: &str =
    "it would run a command inside the node; put a token or client-certificate-data inline";
const READS_A_FILE: &str = "it would read a file of the node's own filesystem; put the data inline \
     (the field's -data variant, or token)";
const SKIPS_VERIFICATION: &str = "the server's certificate would not be verified; give \
     certificate-authority-data, or set allowInsecureSkipTlsVerify on the remote cluster";

/// Checks every user and cluster of `kubeconfig`; `allow_insecure` lets
/// `insecure-skip-tls-verify: true` through.
pub fn vet(kubeconfig: &Kubeconfig, allow_insecure: bool) -> Result<(), KubeconfigRefused> {
    for named in &kubeconfig.auth_infos {
        if let Some(user) = &named.auth_info {
            vet_user(user).map_err(|(field, why)| KubeconfigRefused {
                entry: format!("users[{:?}]", named.name),
                field,
                why,
            })?;
        }
    }
    for named in &kubeconfig.clusters {
        if let Some(cluster) = &named.cluster {
            vet_cluster(cluster, allow_insecure).map_err(|(field, why)| KubeconfigRefused {
                entry: format!("clusters[{:?}]", named.name),
                field,
                why,
            })?;
        }
    }
    Ok(())
}

fn vet_user(user: &AuthInfo) -> Result<(), (&'static str, &'static str)> {
    let refused = [
        ("exec", user.exec.is_some(), RUNS_A_COMMAND),
        (
            "auth-provider",
            user.auth_provider.is_some(),
            RUNS_A_COMMAND,
        ),
        ("tokenFile", user.token_file.is_some(), READS_A_FILE),
        (
            "client-certificate",
            user.client_certificate.is_some(),
            READS_A_FILE,
        ),
        ("client-key", user.client_key.is_some(), READS_A_FILE),
    ];
    first_refused(&refused)
}

fn vet_cluster(
    cluster: &Cluster,
    allow_insecure: bool,
) -> Result<(), (&'static str, &'static str)> {
    let insecure = cluster.insecure_skip_tls_verify == Some(true) && !allow_insecure;
    let refused = [
        (
            "certificate-authority",
            cluster.certificate_authority.is_some(),
            READS_A_FILE,
        ),
        ("insecure-skip-tls-verify", insecure, SKIPS_VERIFICATION),
    ];
    first_refused(&refused)
}

fn first_refused(
    checks: &[(&'static str, bool, &'static str)],
) -> Result<(), (&'static str, &'static str)> {
    match checks.iter().find(|(_, set, _)| *set) {
        Some((field, _, why)) => Err((field, why)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(user: &str, cluster: &str) -> Kubeconfig {
        let yaml = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n\
             clusters: [{{name: k, cluster: {{server: 'https://10.0.0.1:6443'{cluster}}}}}]\n\
             users: [{{name: u, user: {{token: abc{user}}}}}]\n"
        );
        Kubeconfig::from_yaml(&yaml).unwrap()
    }

    #[test]
    fn inline_credentials_are_accepted() {
        let inline = parse(
            ", client-certificate-data: Y2VydA==, client-key-data: a2V5",
            ", certificate-authority-data: Y2E=, tls-server-name: api",
        );
        vet(&inline, false).unwrap();
    }

    #[test]
    fn commands_and_file_paths_are_refused_by_entry_and_field() {
        let cases = [
            (
                ", exec: {command: /bin/sh, apiVersion: client.authentication.k8s.io/v1}",
                "",
                "exec",
            ),
            (
                ", auth-provider: {name: gcp, config: {cmd-path: /bin/sh}}",
                "",
                "auth-provider",
            ),
            (
                ", tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token",
                "",
                "tokenFile",
            ),
            (", client-certificate: /etc/cert", "", "client-certificate"),
            (", client-key: /etc/key", "", "client-key"),
            (
                "",
                ", certificate-authority: /etc/ca.crt",
                "certificate-authority",
            ),
        ];
        for (user, cluster, field) in cases {
            let e = vet(&parse(user, cluster), true).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            let entry = if user.is_empty() {
                "clusters[\"k\"]"
            } else {
                "users[\"u\"]"
            };
            assert_eq!(e.entry, entry, "{e}");
            assert!(e.to_string().contains(field), "{e}");
        }
    }

    #[test]
    fn skipping_tls_verification_needs_the_setting() {
        let insecure = parse("", ", insecure-skip-tls-verify: true");
        let e = vet(&insecure, false).unwrap_err();
        assert_eq!(e.field, "insecure-skip-tls-verify");
        assert!(e.to_string().contains("allowInsecureSkipTlsVerify"), "{e}");
        vet(&insecure, true).unwrap();
        vet(&parse("", ", insecure-skip-tls-verify: false"), false).unwrap();
    }

    #[test]
    fn an_entry_outside_the_current_context_is_checked_too() {
        let mut kubeconfig = parse("", "");
        let mut other = kubeconfig.auth_infos[0].clone();
        other.name = "spare".into();
        other.auth_info.as_mut().unwrap().token_file = Some("/etc/passwd".into());
        kubeconfig.auth_infos.push(other);
        let e = vet(&kubeconfig, false).unwrap_err();
        assert_eq!(e.entry, "users[\"spare\"]");
    }
}
