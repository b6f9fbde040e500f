//! Where bytes live: local files, opened only when they are what they claim to be and read with
//! caps (`local`), and written durably, never half (`output`). Imports `util` only.

pub mod local;
pub mod output;
