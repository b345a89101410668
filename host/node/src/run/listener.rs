//! The `connections:` setting of the node's two HTTPS listeners (`kubeletApi.connections`,
//! `runner.connections`): how many connections each serves at once and how long a client has
//! to send a request's headers and body. Not the listeners themselves
//! (`neocloud_remote::serving`).

use std::time::Duration;

use anyhow::bail;
use neocloud_remote::serving::ServeLimits;
use serde::Deserialize;

/// A listener's bounds; every field defaults to [`ServeLimits::default`].
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConnectionSettings {
    /// Connections served at once after their TLS handshake; one more is closed at once.
    #[serde(default = "default_max")]
    pub max: usize,
    /// Seconds a client has to send a request's headers (and the longest a kept-alive
    /// connection may stay silent).
    #[serde(default = "default_header_read_timeout")]
    pub header_read_timeout_seconds: u64,
    /// Seconds a request's body may take to arrive in full.
    #[serde(default = "default_body_timeout")]
    pub body_timeout_seconds: u64,
}

fn default_max() -> usize {
    ServeLimits::default().max_connections
}
fn default_header_read_timeout() -> u64 {
    ServeLimits::default().header_read_timeout.as_secs()
}
fn default_body_timeout() -> u64 {
    ServeLimits::default().body_timeout.as_secs()
}

impl Default for ConnectionSettings {
    fn default() -> Self {
        ConnectionSettings {
            max: default_max(),
            header_read_timeout_seconds: default_header_read_timeout(),
            body_timeout_seconds: default_body_timeout(),
        }
    }
}

impl ConnectionSettings {
    /// Checks the fields of `section` (`kubeletApi.connections`); errors name the field.
    pub fn check(&self, section: &str) -> anyhow::Result<()> {
        if self.max == 0 {
            bail!("{section}.max: 0 would refuse every connection");
        }
        for (field, seconds) in [
            ("headerReadTimeoutSeconds", self.header_read_timeout_seconds),
            ("bodyTimeoutSeconds", self.body_timeout_seconds),
        ] {
            if seconds == 0 {
                bail!("{section}.{field}: 0 would cut every request off");
            }
        }
        Ok(())
    }

    /// The listener's bounds.
    pub fn limits(&self) -> ServeLimits {
        ServeLimits {
            max_connections: self.max,
            header_read_timeout: Duration::from_secs(self.header_read_timeout_seconds),
            body_timeout: Duration::from_secs(self.body_timeout_seconds),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_fields_are_the_listener_defaults_and_zero_is_refused_by_name() {
        let settings: ConnectionSettings = serde_yaml::from_str("max: 64").unwrap();
        let limits = settings.limits();
        assert_eq!(limits.max_connections, 64);
        assert_eq!(
            limits.header_read_timeout,
            ServeLimits::default().header_read_timeout
        );
        assert_eq!(limits.body_timeout, ServeLimits::default().body_timeout);
        let zero: ConnectionSettings = serde_yaml::from_str("bodyTimeoutSeconds: 0").unwrap();
        let refused = zero.check("runner.connections").unwrap_err().to_string();
        assert!(
            refused.starts_with("runner.connections.bodyTimeoutSeconds: 0"),
            "{refused}"
        );
        assert!(serde_yaml::from_str::<ConnectionSettings>("maxConns: 1").is_err());
    }
}
