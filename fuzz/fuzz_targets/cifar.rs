//! Fuzz `source::cifar::read` for both variants and split the records as `convert` does (label
//! byte, 3072 pixel bytes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use prep::source::cifar::{read, Variant, PIXELS};

#[path = "common/decoder_input.rs"]
mod input;

fuzz_target!(|data: &[u8]| {
    let path = input::write("data_batch_1.bin", data);
    for v in [Variant::Cifar10, Variant::Cifar100] {
        let r = read(&path, v);
        if input::verbose() {
            eprintln!("{v:?}: {:?}", r.as_ref().map(Vec::len));
        }
        if let Ok(raw) = r {
            let mut labels = 0u64;
            let mut px = Vec::with_capacity(raw.len() / v.record() * PIXELS);
            for rec in raw.chunks_exact(v.record()) {
                labels += rec[v.label_offset()] as u64;
                px.extend_from_slice(&rec[v.record() - PIXELS..]);
            }
            std::hint::black_box((labels, px));
        }
    }
});
