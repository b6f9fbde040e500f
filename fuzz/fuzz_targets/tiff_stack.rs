//! Fuzz the TIFF-stack path of `convert` (`.tif` files): `FileKind::Tiff` probe and decode
//! (`source::tiff::decode`: every page and sample type through the `tiff` crate), then each page into a
//! sample.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prep::source::FileKind;

#[path = "common/decoder_input.rs"]
mod input;

fuzz_target!(|data: &[u8]| {
    let path = input::write("stack.tif", data);
    input::probe_and_decode(FileKind::Tiff, &path, data.len());
});
