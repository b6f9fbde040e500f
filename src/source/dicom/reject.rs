//! Errors of the DICOM crates turned into a reason that names the transfer syntax; panics inside
//! them caught.

use super::*;

/// Run a dicom-rs call, turning a panic into a `Reject`.
pub(super) fn guard<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, Reject> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Reject::new(format!("{what}: the decoder failed on this file ({msg})"))
    })
}

/// An error and its sources, "outer: inner: innermost" (snafu errors often repeat their source in
/// their message; repeats are dropped).
pub(super) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur = Some(e);
    while let Some(err) = cur {
        let s = err.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
        cur = err.source();
    }
    parts.join(": ")
}

pub(super) fn is_eof(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::UnexpectedEof {
                return true;
            }
        }
        let s = err.to_string().to_ascii_lowercase();
        if s.contains("unexpected end")
            || s.contains("failed to fill whole buffer")
            || s.contains("end of file")
        {
            return true;
        }
        cur = err.source();
    }
    false
}

pub(super) fn read_reject(e: &dicom_object::ReadError, ts: &str) -> Reject {
    let text = chain(e);
    if is_eof(e) {
        return Reject::new(format!("truncated DICOM: {text}"));
    }
    if text.to_ascii_lowercase().contains("transfer syntax") {
        return Reject::new(format!(
            "unsupported transfer syntax {}: {text}",
            ts_label(ts)
        ));
    }
    Reject::new(format!("invalid DICOM: {text}"))
}

pub(super) fn pixel_reject(e: &dicom_pixeldata::Error, ts: &str) -> Reject {
    let text = chain(e);
    let lower = text.to_ascii_lowercase();
    if lower.contains("unsupported transfersyntax") || lower.contains("unknown transfer syntax") {
        return Reject::new(format!("unsupported transfer syntax {}", ts_label(ts)));
    }
    if is_eof(e) {
        return Reject::new(format!("truncated DICOM pixel data: {text}"));
    }
    Reject::new(format!(
        "cannot decode DICOM pixel data ({}): {text}",
        ts_label(ts)
    ))
}

/// "UID (name)" for the transfer syntaxes one meets, "UID" otherwise.
pub(super) fn ts_label(uid: &str) -> String {
    let name = match uid {
        "1.2.840.10008.1.2" => "Implicit VR Little Endian",
        "1.2.840.10008.1.2.1" => "Explicit VR Little Endian",
        "1.2.840.10008.1.2.1.98" => "Encapsulated Uncompressed",
        "1.2.840.10008.1.2.1.99" => "Deflated Explicit VR Little Endian",
        "1.2.840.10008.1.2.2" => "Explicit VR Big Endian",
        "1.2.840.10008.1.2.4.50" => "JPEG Baseline",
        "1.2.840.10008.1.2.4.51" => "JPEG Extended",
        "1.2.840.10008.1.2.4.57" | "1.2.840.10008.1.2.4.70" => "JPEG Lossless",
        "1.2.840.10008.1.2.4.80" => "JPEG-LS Lossless",
        "1.2.840.10008.1.2.4.81" => "JPEG-LS Near-Lossless",
        "1.2.840.10008.1.2.4.90" => "JPEG 2000 Lossless",
        "1.2.840.10008.1.2.4.91" => "JPEG 2000",
        "1.2.840.10008.1.2.4.92" | "1.2.840.10008.1.2.4.93" => "JPEG 2000 Part 2",
        "1.2.840.10008.1.2.4.94" | "1.2.840.10008.1.2.4.95" => "JPIP",
        "1.2.840.10008.1.2.4.100" | "1.2.840.10008.1.2.4.101" => "MPEG-2",
        "1.2.840.10008.1.2.4.102"
        | "1.2.840.10008.1.2.4.103"
        | "1.2.840.10008.1.2.4.104"
        | "1.2.840.10008.1.2.4.105"
        | "1.2.840.10008.1.2.4.106" => "MPEG-4",
        "1.2.840.10008.1.2.4.107" | "1.2.840.10008.1.2.4.108" => "HEVC",
        "1.2.840.10008.1.2.4.110" | "1.2.840.10008.1.2.4.111" | "1.2.840.10008.1.2.4.112" => {
            "JPEG XL"
        }
        "1.2.840.10008.1.2.4.201" | "1.2.840.10008.1.2.4.202" | "1.2.840.10008.1.2.4.203" => {
            "HTJ2K"
        }
        "1.2.840.10008.1.2.5" => "RLE Lossless",
        "1.2.840.10008.1.2.8.1" => "Deflated Image Frame Compression",
        _ => return uid.to_string(),
    };
    format!("{uid} ({name})")
}
