//! Fuzz `source::npy::read_images` (as a u8/u16 target and as a float target, reading its first
//! samples) and `source::npy::read_labels` on arbitrary `.npy` bytes. `read_labels` only reads an
//! array of the length it is told, so it is asked for the length the images read gave, else for
//! the first dimension the header declares.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prep::source::npy::{read_images, read_labels};

#[path = "common/decoder_input.rs"]
mod input;

/// The first number after `'shape': (` in the header text, if any (mutations may break it).
fn declared_len(data: &[u8]) -> Option<usize> {
    let head = &data[..data.len().min(4096)];
    let key = b"'shape': (";
    let at = head.windows(key.len()).position(|w| w == key)? + key.len();
    let digits: Vec<u8> = head[at..]
        .iter()
        .copied()
        .take_while(u8::is_ascii_digit)
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

fuzz_target!(|data: &[u8]| {
    let path = input::write("train_images.npy", data);
    let mut n = None;
    for float in [false, true] {
        let r = read_images(&path, float);
        if input::verbose() {
            eprintln!(
                "float {float}: {:?}",
                r.as_ref()
                    .map(|i| (i.n, i.channels, i.height, i.width, i.dtype))
            );
        }
        if let Ok(im) = r {
            // The header was checked against the file's length: every sample must read.
            let take = im.n.min(64);
            let mut data = Vec::new();
            im.read(0, take, &mut data).expect("a checked array reads");
            assert_eq!(
                data.len(),
                take * im.sample_bytes(),
                "data does not match the shape"
            );
            std::hint::black_box(&data);
            n = Some(im.n);
        }
    }
    if let Some(n) = n.or_else(|| declared_len(data)) {
        let r = read_labels(&path, n);
        if input::verbose() {
            eprintln!("labels({n}): {r:?}");
        }
        if let Ok(l) = r {
            assert_eq!(l.len(), n);
        }
    }
});
