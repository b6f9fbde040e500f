//! Fuzz the DICOM path of `convert`: `read_header` (what series grouping reads), `FileKind::Dicom`
//! probe and decode (`source::dicom`, dicom-rs behind prep's prescan), then each frame into a
//! sample. The options (default, float, axis 0, axis 1) are picked by the input's length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prep::source::FileKind;

#[path = "common/decoder_input.rs"]
mod input;

fuzz_target!(|data: &[u8]| {
    let path = input::write("slice.dcm", data);
    let _ = prep::source::dicom::read_header(&path);
    input::probe_and_decode(FileKind::Dicom, &path, data.len());
});
