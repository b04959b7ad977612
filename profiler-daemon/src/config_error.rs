//! The one error type of configuration, shared by every component's section: a leaf module (it
//! imports nothing of the crate), so that components check their own section without importing
//! the `config` module that gathers them.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid `{field}`{}: {reason}", flag.map(|f| format!(" (flag --{f})")).unwrap_or_default())]
    Invalid {
        field: &'static str,
        /// The flag that sets it too, if any.
        flag: Option<&'static str>,
        reason: String,
    },
}

/// A field's value is wrong (`reason` says how); no flag sets it.
pub fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        flag: None,
        reason: reason.into(),
    }
}
