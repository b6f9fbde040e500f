//! Typed errors of the library. Every error that concerns a file names it; errors inside a shard also
//! name the region (header, block, footer) so a user knows what exactly is damaged.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where in a shard file a problem was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Region {
    File,
    Header,
    Block(u32),
    Footer,
    Trailer,
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Region::File => write!(f, "file"),
            Region::Header => write!(f, "header"),
            Region::Block(i) => write!(f, "block {i}"),
            Region::Footer => write!(f, "footer"),
            Region::Trailer => write!(f, "trailer"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The message shows the OS error, so it is not also this error's `source()`: an error chain
    /// printed in full (anyhow's `{:#}`) would repeat it ("...: No space left on device (os error
    /// 28): No space left on device (os error 28)").
    #[error("{}: {cause}", shown_path(path))]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// The bytes of a shard file break a rule of `formats/shard.md`.
    #[error("{}: {region}: {what}", shown_path(path))]
    Corrupt {
        path: PathBuf,
        region: Region,
        what: String,
    },
    /// `manifest.json` (or a colmajor `manifest.json`) is malformed or disagrees with the files.
    #[error("{}: {what}", shown_path(path))]
    Manifest { path: PathBuf, what: String },
    /// An input file cannot be used (and the run was asked to stop on bad input, or nothing
    /// usable is left). Names the file.
    #[error("{0}")]
    Source(String),
    /// The caller asked for something impossible (bad shape, zero classes, ...).
    #[error("{0}")]
    Invalid(String),
    /// The GPU, its driver or a CUDA library is missing or failed.
    #[error("{0}")]
    Device(String),
    /// Another prep is writing the folder (`crate::format::lock`); names the holder.
    #[error("{0}")]
    Busy(String),
    /// SIGINT or SIGTERM asked the job to stop (`crate::util::interrupt`); `note` says what was kept
    /// and how to go on, where the job knows it.
    #[error("interrupted by {}{}", signal_name(*signal), note_suffix(note))]
    Interrupted { signal: i32, note: String },
}

fn note_suffix(note: &str) -> String {
    if note.is_empty() {
        String::new()
    } else {
        format!("; {note}")
    }
}

/// A path (or a relative path of a tree) for a message or a report line on a terminal: as it
/// is, unless it holds a control character (a newline would forge a line of its own), starts or
/// ends with white space, or starts with '"': then quoted and escaped as a JSON string
/// (`"a\nb.png"`).
pub fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    let plain = !s.chars().any(char::is_control)
        && !s.starts_with(|c: char| c.is_whitespace() || c == '"')
        && !s.ends_with(char::is_whitespace);
    if plain {
        s.into()
    } else {
        serde_json::to_string(s).unwrap_or_default().into()
    }
}

/// [`shown`] for a path.
pub fn shown_path(p: &Path) -> String {
    shown(&p.to_string_lossy()).into_owned()
}

/// "SIGINT", "SIGTERM", "signal N": how an interruption is named (`crate::util::interrupt`).
pub fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        s => format!("signal {s}"),
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(path: impl AsRef<Path>, cause: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            cause,
        }
    }
    pub fn is_interrupted(&self) -> bool {
        matches!(self, Error::Interrupted { .. })
    }
    /// An interruption with `note` (what was kept, how to go on) added; other errors unchanged.
    pub fn when_interrupted(self, note: impl FnOnce() -> String) -> Self {
        match self {
            Error::Interrupted { signal, .. } => Error::Interrupted {
                signal,
                note: note(),
            },
            e => e,
        }
    }
    pub fn corrupt(path: impl AsRef<Path>, region: Region, what: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.as_ref().to_path_buf(),
            region,
            what: what.into(),
        }
    }
    pub fn manifest(path: impl AsRef<Path>, what: impl Into<String>) -> Self {
        Error::Manifest {
            path: path.as_ref().to_path_buf(),
            what: what.into(),
        }
    }
}

/// Attach a path to an `io::Result`.
pub trait IoContext<T> {
    fn at(self, path: impl AsRef<Path>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: impl AsRef<Path>) -> Result<T> {
        self.map_err(|e| Error::io(path, e))
    }
}
