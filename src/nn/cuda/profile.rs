//! GPU time per kernel (PREP_PROFILE=1), measured with events around each launch.

use super::*;

/// GPU time per kernel name, for finding where a step's time goes (PREP_PROFILE=1).
#[derive(Default)]
pub(super) struct Profile {
    pending: Vec<(String, sys::CUevent, sys::CUevent)>,
    totals: std::collections::BTreeMap<String, (f64, u64)>,
}

impl Profile {
    pub(super) fn begin(&mut self, stream: sys::CUstream) -> sys::CUevent {
        let mut e = std::ptr::null_mut();
        unsafe {
            sys::cuEventCreate(&mut e, 0);
            sys::cuEventRecord(e, stream);
        }
        e
    }
    pub(super) fn end(&mut self, name: &str, start: sys::CUevent, stream: sys::CUstream) {
        let mut e = std::ptr::null_mut();
        unsafe {
            sys::cuEventCreate(&mut e, 0);
            sys::cuEventRecord(e, stream);
        }
        self.pending.push((name.to_string(), start, e));
    }
    /// After the stream has drained.
    pub(super) fn collect(&mut self) {
        for (name, a, b) in self.pending.drain(..) {
            let mut ms = 0f32;
            unsafe {
                sys::cuEventElapsedTime_v2(&mut ms, a, b);
                sys::cuEventDestroy_v2(a);
                sys::cuEventDestroy_v2(b);
            }
            let t = self.totals.entry(name).or_default();
            t.0 += ms as f64;
            t.1 += 1;
        }
    }
    pub(super) fn report(&self) {
        let all: f64 = self.totals.values().map(|t| t.0).sum();
        let mut v: Vec<_> = self.totals.iter().collect();
        v.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
        eprintln!("GPU time by kernel (PREP_PROFILE): {all:.1} ms in all");
        for (name, (ms, n)) in v {
            eprintln!(
                "  {name:<28} {ms:>10.2} ms {n:>8} calls {:>8.1} us/call",
                ms * 1000.0 / *n as f64
            );
        }
    }
}
