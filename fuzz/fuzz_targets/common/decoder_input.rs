//! Shared by the `convert` decoder targets: the decoders take paths, so each input is written to
//! one file in a temporary folder of this process (rewritten every run), and every decoded frame
//! is turned into a small sample as `convert` does, so the frame's pixels are really read.
#![allow(dead_code)]

use prep::format::shard::Dtype;
use prep::source::transform::{to_sample, Fit, Target};
use prep::source::{DecodeOptions, Frame, Reject};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `name` (its extension picks the decoder as in `convert`) in this process's temp folder, holding
/// `data`.
pub fn write(name: &str, data: &[u8]) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("prep-fuzz-dec-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("create the fuzz temp folder");
        d
    });
    let p = dir.join(name);
    std::fs::write(&p, data).expect("write fuzz input to the temp file");
    p
}

/// Decode options picked by a number from the input (its length), so one target covers the
/// option sets `convert` passes: the default (axis 2, 8/16-bit images), float values, and cuts
/// along axes 0 and 1 with an explicit window.
pub fn options(pick: usize) -> DecodeOptions {
    let d = DecodeOptions::default();
    match pick % 4 {
        0 => d,
        1 => DecodeOptions { float: true, ..d },
        2 => DecodeOptions {
            axis: 0,
            window: Some((-100.0, 400.0)),
            ..d
        },
        _ => DecodeOptions {
            axis: 1,
            percentiles: (0.0, 100.0),
            ..d
        },
    }
}

/// What `convert` does with each frame: into a sample of a fixed small target (crop, stretch or
/// pad by `pick`), float frames to f32. Rejects (NaN values and the like) are expected.
pub fn sink(pick: usize) -> impl FnMut(Frame) -> Result<(), Reject> {
    let mut out = Vec::new();
    let fit = [Fit::Crop, Fit::Stretch, Fit::Pad][pick % 3];
    move |frame: Frame| {
        let (channels, _) = frame.native();
        let dtype = match frame {
            Frame::Image(_) => Dtype::U8,
            Frame::Float(_) => Dtype::F32,
        };
        let t = Target {
            channels,
            height: 5,
            width: 7,
            dtype,
            fit,
        };
        out.clear();
        let _ = to_sample(frame, &t, &mut out);
        Ok(())
    }
}

/// With `PREP_FUZZ_VERBOSE` set, the targets print what each input gave (to check that the seeds
/// decode: `PREP_FUZZ_VERBOSE=1 cargo fuzz run TARGET seeds/TARGET -- -runs=0`).
pub fn verbose() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| std::env::var_os("PREP_FUZZ_VERBOSE").is_some())
}

/// Probe and decode `path` as `kind`, as `convert` does for a file of a tree.
pub fn probe_and_decode(kind: prep::source::FileKind, path: &Path, pick: usize) {
    let opts = options(pick);
    let probe = kind.probe(path, &opts);
    let mut frames = 0;
    let mut sink = sink(pick);
    let r = kind.decode(path, &opts, &mut |f| {
        frames += 1;
        sink(f)
    });
    if verbose() {
        eprintln!(
            "{} bytes, {opts:?}: probe {probe:?}; decode {r:?}, {frames} frames",
            pick
        );
    }
}
