//! Errors of the simulator's Rust API (starting servers, reading config files).
//!
//! Not the errors a simulator returns over HTTP: those are provider wire bodies built in each
//! provider module.

/// An error starting or configuring a simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The listener could not be bound.
    #[error("failed to bind simulator listener on {addr}: {source}")]
    Bind {
        /// The address that was requested.
        addr: String,
        /// The underlying IO error.
        source: std::io::Error,
    },
    /// The config file could not be read.
    #[error("failed to read simulator config {path}: {source}")]
    ReadConfig {
        /// The path of the file.
        path: String,
        /// The underlying IO error.
        source: std::io::Error,
    },
    /// The config file is not valid YAML for [`crate::CloudSimConfig`].
    #[error("failed to parse simulator config {path}: {source}")]
    ParseConfig {
        /// The path of the file.
        path: String,
        /// The parser's error.
        source: serde_yaml::Error,
    },
    /// The config is well-formed but inconsistent.
    #[error("invalid simulator config: {0}")]
    InvalidConfig(String),
}
