//! zstd frames as blocks store them: one compression and one decompression context per thread,
//! a literals-only encoder for `pred`'s residuals, and the checks made on a frame before any
//! byte of it is trusted.

use crate::util::error::{Error, Result};

/// The `raw_len` bytes of zstd frame `stored`, in `buf`'s allocation, after the checks that keep
/// hostile bytes from making the reader allocate.
pub(super) fn unzstd(
    stored: &[u8],
    raw_len: usize,
    mut buf: Vec<u8>,
    bad: &dyn Fn(String) -> Error,
) -> Result<Vec<u8>> {
    // One byte of zstd data never decodes to more than 32768 bytes (an RLE block of 4 bytes
    // holds at most 128 KiB), so a larger claim is a lie told to make us allocate.
    if raw_len as u64 > (stored.len() as u64).saturating_mul(32768) {
        return Err(bad(format!(
            "{} stored bytes cannot decode to {raw_len} bytes",
            stored.len()
        )));
    }
    // Trust no size before the frame's own header agrees with the index: a few hostile
    // bytes must not make the reader allocate up to the cap.
    match zstd::zstd_safe::get_frame_content_size(stored) {
        Ok(Some(c)) if c == raw_len as u64 => {}
        Ok(Some(c)) => {
            return Err(bad(format!(
                "zstd frame declares {c} bytes, the index says {raw_len}"
            )))
        }
        _ => {
            return Err(bad(
                "zstd frame header is damaged or does not declare its size".into(),
            ))
        }
    }
    buf.clear();
    buf.reserve(raw_len);
    decompress(stored, &mut buf).map_err(|e| bad(format!("zstd frame does not decode: {e}")))?;
    if buf.len() != raw_len {
        return Err(bad(format!(
            "decodes to {} bytes, expected {raw_len}",
            buf.len()
        )));
    }
    Ok(buf)
}

/// zstd decoding into the spare capacity of `out` (at most its capacity), with one reused
/// decompression context per thread.
fn decompress(stored: &[u8], out: &mut Vec<u8>) -> std::io::Result<usize> {
    use std::cell::RefCell;
    thread_local! {
        static DCTX: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
    }
    DCTX.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            *d = Some(zstd::bulk::Decompressor::new()?);
        }
        d.as_mut().unwrap().decompress_to_buffer(stored, out)
    })
}

/// zstd with one reused compression context per thread and level.
pub(super) fn compress(data: &[u8], level: i32) -> Result<Vec<u8>> {
    use std::cell::RefCell;
    thread_local! {
        static CCTX: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    }
    CCTX.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().map(|(l, _)| *l) != Some(level) {
            let z = zstd::bulk::Compressor::new(level)
                .map_err(|e| Error::Invalid(format!("zstd level {level}: {e}")))?;
            *c = Some((level, z));
        }
        let z = &mut c.as_mut().unwrap().1;
        z.compress(data)
            .map_err(|e| Error::Invalid(format!("zstd compression failed: {e}")))
    })
}

/// A zstd frame of `data` made of literals only: no match is searched for or stored, so the
/// frame decodes at the speed of zstd's Huffman stage.
pub(super) fn compress_literals(data: &[u8], level: i32) -> Result<Vec<u8>> {
    use std::cell::RefCell;
    use zstd::zstd_safe::zstd_sys as sys;
    struct Ctx(*mut sys::ZSTD_CCtx);
    impl Drop for Ctx {
        fn drop(&mut self) {
            // SAFETY: the context was made by ZSTD_createCCtx and is freed once.
            unsafe { sys::ZSTD_freeCCtx(self.0) };
        }
    }
    thread_local! {
        static CTX: RefCell<Option<Ctx>> = const { RefCell::new(None) };
    }
    let fail = |what: &str| Error::Invalid(format!("zstd literal compression failed: {what}"));
    CTX.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            // SAFETY: plain constructor; a null result is checked.
            let p = unsafe { sys::ZSTD_createCCtx() };
            if p.is_null() {
                return Err(fail("no context"));
            }
            *c = Some(Ctx(p));
        }
        let ctx = c.as_ref().unwrap().0;
        let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(data.len()));
        // SAFETY: ctx is a live context; no sequences are passed, so every byte of `data` is a
        // literal; `out` has compress_bound bytes of capacity and its length is set to what
        // zstd wrote only after checking the result.
        unsafe {
            sys::ZSTD_CCtx_reset(
                ctx,
                sys::ZSTD_ResetDirective::ZSTD_reset_session_and_parameters,
            );
            sys::ZSTD_CCtx_setParameter(ctx, sys::ZSTD_cParameter::ZSTD_c_compressionLevel, level);
            sys::ZSTD_CCtx_setParameter(ctx, sys::ZSTD_cParameter::ZSTD_c_contentSizeFlag, 1);
            let n = sys::ZSTD_compressSequences(
                ctx,
                out.as_mut_ptr() as *mut _,
                out.capacity(),
                std::ptr::null(),
                0,
                data.as_ptr() as *const _,
                data.len(),
            );
            if sys::ZSTD_isError(n) != 0 {
                let name = std::ffi::CStr::from_ptr(sys::ZSTD_getErrorName(n));
                return Err(fail(&name.to_string_lossy()));
            }
            out.set_len(n);
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::error::Region;
    use std::path::Path;

    #[test]
    fn literal_frames_declare_their_size_and_decode_to_their_bytes() {
        let bad = |what: String| Error::corrupt(Path::new("t.shard"), Region::Block(0), what);
        let mut seed = 11u64;
        for len in [1usize, 2, 1000, 128 << 10, (128 << 10) + 1, 1 << 20] {
            // Small residuals, as the filter leaves them: Huffman codes pay.
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    [0u8, 1, 255, 2, 254][(seed % 5) as usize]
                })
                .collect();
            let frame = compress_literals(&data, 1).unwrap();
            if len >= 1000 {
                assert!(frame.len() < data.len() / 2, "{len}: {}", frame.len());
            }
            let back = unzstd(&frame, len, Vec::new(), &bad).unwrap();
            assert_eq!(back, data, "{len}");
            // The index must agree with the frame's declared size.
            assert!(unzstd(&frame, len + 1, Vec::new(), &bad).is_err());
        }
    }

    #[test]
    fn runs_cost_literal_frames_a_bit_a_value_and_matches_far_less() {
        // Why the pred writer tries matches where literals come under 2 bits a value.
        let data: Vec<u8> = (0..1usize << 20).map(|i| (i % 997 == 0) as u8).collect();
        let literal = compress_literals(&data, 1).unwrap().len();
        let matched = compress(&data, 1).unwrap().len();
        assert!(literal >= data.len() / 8, "{literal}");
        assert!(matched * 8 < literal, "{literal} {matched}");
    }
}
