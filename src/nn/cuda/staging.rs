//! Host batches on their way to the GPU: a small ring of slots, each a page-locked (pinned) host
//! buffer with a device buffer beside it, or one buffer of CUDA managed memory. A batch is packed
//! into a slot, copied (pinned) or prefetched (managed) on the copy stream, and the compute stream
//! waits for that copy only, so the copy of batch i+1 overlaps the computation of batch i. A slot
//! is reused once the kernel that read it has finished (its `consumed` event).

use super::mem_info;
use cudarc::driver::{result as dr, sys, CudaContext, CudaEvent, CudaStream};
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Pinned,
    Managed,
}

struct Slot {
    host: *mut u8,
    dev: u64,
    cap: usize,
    copied: CudaEvent,
    consumed: CudaEvent,
    in_use: bool,
}

pub struct Ring {
    kind: Kind,
    ordinal: i32,
    slots: Vec<Slot>,
    next: usize,
    last: usize,
    /// Bytes held in slots (host and device, or managed).
    pub bytes: usize,
}

const ALIGN: usize = 256;

impl Ring {
    pub fn new(ctx: &Arc<CudaContext>, kind: Kind, depth: usize) -> Result<Self, String> {
        let mut slots = Vec::new();
        for _ in 0..depth {
            slots.push(Slot {
                host: std::ptr::null_mut(),
                dev: 0,
                cap: 0,
                copied: ctx.new_event(None).map_err(|e| format!("{e:?}"))?,
                consumed: ctx.new_event(None).map_err(|e| format!("{e:?}"))?,
                in_use: false,
            });
        }
        Ok(Ring {
            kind,
            ordinal: ctx.ordinal() as i32,
            slots,
            next: 0,
            last: 0,
            bytes: 0,
        })
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Pack `parts` into the next slot and start its copy on `copy`; `compute` will wait for it.
    /// Returns the device address of each part.
    pub fn put(
        &mut self,
        parts: &[&[u8]],
        copy: &CudaStream,
        compute: &CudaStream,
    ) -> Result<Vec<u64>, String> {
        let i = self.next;
        self.next = (self.next + 1) % self.slots.len();
        self.last = i;
        let mut offsets = Vec::with_capacity(parts.len());
        let mut total = 0usize;
        for p in parts {
            offsets.push(total);
            total += p.len().div_ceil(ALIGN) * ALIGN;
        }
        let kind = self.kind;
        let ordinal = self.ordinal;
        let slot = &mut self.slots[i];
        if slot.in_use {
            slot.consumed.synchronize().map_err(|e| format!("{e:?}"))?;
            slot.in_use = false;
        }
        if slot.cap < total {
            let cap = total + total / 4;
            let grow = cap - slot.cap;
            unsafe { free_slot(kind, slot) };
            self.bytes -= slot.cap * if kind == Kind::Pinned { 2 } else { 1 };
            slot.cap = 0;
            unsafe {
                match kind {
                    Kind::Pinned => {
                        slot.host = dr::malloc_host(cap, 0).map_err(|e| {
                            format!("allocating {cap} bytes of pinned host memory: {e:?}")
                        })? as *mut u8;
                        slot.dev = dr::malloc_sync(cap)
                            .map_err(|e| format!("allocating {cap} bytes of GPU memory: {e:?}"))?;
                    }
                    Kind::Managed => {
                        // Managed memory beyond what the GPU has free can hang the GPU: refuse.
                        let (free, _) = mem_info()?;
                        if grow > free / 2 {
                            return Err(format!(
                                "refusing to allocate {cap} bytes of managed memory: the GPU has only {free} bytes free"
                            ));
                        }
                        slot.dev =
                            dr::malloc_managed(cap, sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL)
                                .map_err(|e| {
                                format!("allocating {cap} bytes of managed memory: {e:?}")
                            })?;
                        slot.host = slot.dev as *mut u8;
                    }
                }
            }
            slot.cap = cap;
            self.bytes += cap * if kind == Kind::Pinned { 2 } else { 1 };
        }
        for (p, &o) in parts.iter().zip(&offsets) {
            // SAFETY: the slot holds `total` bytes and no kernel or copy uses it (consumed).
            let dst = unsafe { std::slice::from_raw_parts_mut(slot.host.add(o), p.len()) };
            crate::util::pipeline::copy_parallel(dst, p);
        }
        unsafe {
            match kind {
                Kind::Pinned => sys::cuMemcpyHtoDAsync_v2(
                    slot.dev,
                    slot.host as *const _,
                    total,
                    copy.cu_stream(),
                )
                .result()
                .map_err(|e| format!("copying a batch to the GPU: {e:?}"))?,
                Kind::Managed => {
                    let loc = location(ordinal);
                    dr::mem_prefetch_async(slot.dev, total, loc, copy.cu_stream())
                        .map_err(|e| format!("prefetching a batch to the GPU: {e:?}"))?
                }
            }
        }
        slot.copied.record(copy).map_err(|e| format!("{e:?}"))?;
        compute.wait(&slot.copied).map_err(|e| format!("{e:?}"))?;
        slot.in_use = true;
        Ok(offsets.iter().map(|&o| slot.dev + o as u64).collect())
    }

    /// Mark the slot of the last `put` as read by the work queued so far on `compute`.
    pub fn consumed(&mut self, compute: &CudaStream) -> Result<(), String> {
        self.slots[self.last]
            .consumed
            .record(compute)
            .map_err(|e| format!("{e:?}"))
    }
}

fn location(ordinal: i32) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ordinal,
    }
}

unsafe fn free_slot(kind: Kind, s: &mut Slot) {
    if s.cap == 0 {
        return;
    }
    if kind == Kind::Pinned {
        let _ = dr::free_host(s.host as *mut _);
    }
    let _ = dr::free_sync(s.dev);
    s.host = std::ptr::null_mut();
    s.dev = 0;
}

impl Drop for Ring {
    fn drop(&mut self) {
        let kind = self.kind;
        for s in &mut self.slots {
            if s.in_use {
                let _ = s.consumed.synchronize();
            }
            unsafe { free_slot(kind, s) };
        }
    }
}
