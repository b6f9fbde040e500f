//! Fuzz the NIfTI path of `convert`: `FileKind::Nifti` probe and decode (`source::nifti`, plain or
//! gzipped), then each slice into a sample. The options (default percentile window, float,
//! axis 0 with a fixed window, axis 1) are picked by the input's length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prep::source::FileKind;

#[path = "common/decoder_input.rs"]
mod input;

fuzz_target!(|data: &[u8]| {
    let path = input::write("volume.nii", data);
    input::probe_and_decode(FileKind::Nifti, &path, data.len());
});
