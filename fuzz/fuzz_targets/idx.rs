//! Fuzz `source::idx::read` (plain or gzipped IDX, as `convert` reads MNIST-like datasets) and
//! walk the samples of an accepted array the way `convert` cuts them.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common/decoder_input.rs"]
mod input;

fuzz_target!(|data: &[u8]| {
    let path = input::write("train-images-idx3-ubyte", data);
    let r = prep::source::idx::read(&path);
    if input::verbose() {
        eprintln!("{:?}", r.as_ref().map(|i| &i.dims));
    }
    if let Ok(idx) = r {
        let n: usize = idx.dims.iter().product();
        assert_eq!(
            idx.data.len(),
            n,
            "read() returned data that does not match its dims"
        );
        if idx.dims.len() == 3 && idx.dims[1] * idx.dims[2] > 0 {
            let per = idx.dims[1] * idx.dims[2];
            let sum: u64 = idx
                .data
                .chunks_exact(per)
                .map(|s| s[0] as u64 + s[per - 1] as u64)
                .sum();
            std::hint::black_box(sum);
        }
    }
});
