//! The command line's one error type: what failed, in words, and the kind a script can act
//! on through the exit status (`CliError::exit_code`, listed in the README).

use ckptfs_engine::Error as EngineError;
use std::fmt;
use std::process::ExitCode;

/// Exit statuses besides 0 (done) and 1 (failed otherwise). clap exits 2 for a command line
/// it cannot parse; `ckptfs check` has its own three outcomes (`check.rs`).
pub mod exit {
    /// The path is not a ckptfs space (missing, unformatted, foreign, or from a newer
    /// ckptfs), or a file of one is missing.
    pub const NOT_A_SPACE: u8 = 3;
    /// Another process holds the space (a mount), or a slot is held by another node.
    pub const IN_USE: u8 = 4;
    /// The reserved space, or the filesystem under it, is full.
    pub const NO_SPACE: u8 = 5;
    /// Stored bytes or records failed their checks.
    pub const CORRUPT: u8 = 6;
    /// The space is mounted or opened read-only, or this node lost its slot (fenced).
    pub const READ_ONLY: u8 = 7;
    /// More targets are lost than the redundancy covers.
    pub const TARGETS: u8 = 8;
}

/// A command's failure.
#[derive(Debug)]
pub enum CliError {
    /// An error of the space, kept typed: its kind picks the exit status.
    Engine(EngineError),
    /// Anything else, in words (exit 1).
    Msg(String),
}

impl CliError {
    /// The exit status for this failure (`exit`).
    pub fn exit_code(&self) -> ExitCode {
        let CliError::Engine(e) = self else {
            return ExitCode::FAILURE;
        };
        ExitCode::from(match e {
            EngineError::NotASpace(_) | EngineError::OldSlotNamespace => exit::NOT_A_SPACE,
            EngineError::Locked(_) | EngineError::NamespaceBusy(_) => exit::IN_USE,
            EngineError::NoSpace | EngineError::BackingFull => exit::NO_SPACE,
            EngineError::Corrupt(_) => exit::CORRUPT,
            EngineError::ReadOnly | EngineError::Fenced(_) => exit::READ_ONLY,
            EngineError::Targets(_) | EngineError::OneTarget => exit::TARGETS,
            _ => 1,
        })
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Engine(e) => write!(f, "{e}"),
            CliError::Msg(m) => f.write_str(m),
        }
    }
}

impl From<EngineError> for CliError {
    fn from(e: EngineError) -> Self {
        CliError::Engine(e)
    }
}

impl From<ckptfs_fs::Error> for CliError {
    fn from(e: ckptfs_fs::Error) -> Self {
        match e {
            ckptfs_fs::Error::Engine(e) => CliError::Engine(e),
            other => CliError::Msg(other.to_string()),
        }
    }
}

impl From<String> for CliError {
    fn from(m: String) -> Self {
        CliError::Msg(m)
    }
}

impl From<&str> for CliError {
    fn from(m: &str) -> Self {
        CliError::Msg(m.to_string())
    }
}

impl std::error::Error for CliError {}

impl From<std::ffi::NulError> for CliError {
    fn from(e: std::ffi::NulError) -> Self {
        CliError::Msg(e.to_string())
    }
}

impl From<serde_json::Error> for CliError {
    fn from(e: serde_json::Error) -> Self {
        CliError::Msg(e.to_string())
    }
}

impl From<std::path::StripPrefixError> for CliError {
    fn from(e: std::path::StripPrefixError) -> Self {
        CliError::Msg(e.to_string())
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        CliError::Msg(e.to_string())
    }
}
