//! Secrets on the wire: bootstrap tokens, session tokens and re-authentication credentials are
//! carried as [`Secret`]s, whose `Debug` never shows the value, so a stray `?token` in a log line
//! leaks nothing.
//!
//! Not issuing or checking tokens: the node's callback server does that.

use std::fmt;

/// A secret token. `Debug` never shows the value; [`expose`](Self::expose) does.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// A bootstrap token, as handed to the VM in its `user_data`.
pub type BootstrapToken = Secret;
/// A session token, as presented in `Authorization: Bearer`.
pub type SessionToken = Secret;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_of_a_secret_never_shows_its_value() {
        let secret = Secret::new("tok_very_secret");
        assert_eq!(format!("{secret:?}"), "Secret(<redacted>)");
        assert_eq!(secret.expose(), "tok_very_secret");
    }
}
