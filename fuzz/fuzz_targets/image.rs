//! Fuzz the still-image path of `convert`: `FileKind::Image` probe and decode (`source::images`,
//! the `image` crate with prep's limits; the format is sniffed from the contents, so PNG, JPEG,
//! BMP, GIF, WebP and TIFF inputs all reach their decoders), then each frame into a sample.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prep::source::FileKind;

#[path = "common/decoder_input.rs"]
mod input;

fuzz_target!(|data: &[u8]| {
    let path = input::write("input.png", data);
    input::probe_and_decode(FileKind::Image, &path, data.len());
});
