//! NCCL for data-parallel training: the communicator of one rank and the all-reduce of the
//! gradients. libnccl.so.2 is loaded at run time (cudarc's dynamic loading), only by a run of
//! several ranks.

use cudarc::nccl::{result, sys};

/// Bytes of NCCL's unique id, which rank 0 makes and hands to every rank.
pub const ID_BYTES: usize = 128;

fn present() -> Result<(), String> {
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err("NCCL (libnccl.so.2) is not installed; training on several GPUs needs it".into())
    }
}

/// The loaded NCCL's version, as "2.21.5".
pub fn version() -> String {
    match result::get_nccl_version() {
        Ok(v) => format!("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100),
        Err(e) => format!("of unknown version ({e:?})"),
    }
}

/// A new unique id (rank 0), as bytes for the rendezvous.
pub fn unique_id() -> Result<Vec<u8>, String> {
    present()?;
    let id = result::get_uniqueid().map_err(|e| format!("NCCL: making the unique id: {e:?}"))?;
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

/// One rank's communicator, on the device current when it was made.
pub struct Comm {
    comm: sys::ncclComm_t,
    pub rank: usize,
    pub size: usize,
}

impl Comm {
    /// Join the communicator of `size` ranks named by rank 0's `id`: returns once every rank has
    /// joined. The CUDA context of this rank's device must be current.
    pub fn new(rank: usize, size: usize, id: &[u8]) -> Result<Self, String> {
        present()?;
        let internal: [std::ffi::c_char; ID_BYTES] = id
            .iter()
            .map(|&b| b as std::ffi::c_char)
            .collect::<Vec<_>>()
            .try_into()
            .map_err(|_| {
                format!(
                    "NCCL: the unique id from rank 0 has {} bytes, not {ID_BYTES}",
                    id.len()
                )
            })?;
        let n = i32::try_from(size).map_err(|_| format!("NCCL: {size} ranks are too many"))?;
        let mut comm = std::mem::MaybeUninit::uninit();
        unsafe {
            result::comm_init_rank(
                comm.as_mut_ptr(),
                n,
                sys::ncclUniqueId { internal },
                rank as i32,
            )
            .map_err(|e| format!("NCCL: joining {size} ranks as rank {rank}: {e:?}"))?;
            Ok(Comm {
                comm: comm.assume_init(),
                rank,
                size,
            })
        }
    }

    /// Average float32 tensors in place across the ranks, on `stream`: one NCCL group, which
    /// NCCL fuses into as few transfers as the sizes allow (its own bucketing).
    pub fn average_f32(
        &self,
        tensors: &[(u64, usize)],
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), String> {
        let err = |e: result::NcclError| format!("NCCL: all-reduce of the gradients: {e:?}");
        result::group_start().map_err(err)?;
        let mut first = Ok(());
        for &(ptr, len) in tensors {
            if len == 0 {
                continue;
            }
            let r = self.all_reduce(
                ptr,
                ptr,
                len,
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclAvg,
                stream,
            );
            if let (Ok(()), Err(e)) = (&first, r) {
                first = Err(err(e));
            }
        }
        // The group is closed whatever happened inside it.
        let end = result::group_end().map_err(err);
        first.and(end.map(|_| ()))
    }
}

impl Comm {
    /// `recv` = the sum over the ranks of each rank's `send` (`len` doubles), on `stream`: the
    /// statistics of synchronised batch norm.
    pub fn sum_f64(
        &self,
        send: u64,
        recv: u64,
        len: usize,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), String> {
        let (t, op) = (sys::ncclDataType_t::ncclFloat64, sys::ncclRedOp_t::ncclSum);
        self.all_reduce(send, recv, len, t, op, stream)
            .map_err(|e| format!("NCCL: all-reduce of batch-norm statistics: {e:?}"))
    }

    /// One all-reduce of `len` elements from device address `send` into `recv`, on `stream`.
    fn all_reduce(
        &self,
        send: u64,
        recv: u64,
        len: usize,
        t: sys::ncclDataType_t,
        op: sys::ncclRedOp_t,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), result::NcclError> {
        unsafe {
            result::all_reduce(
                send as *const std::ffi::c_void,
                recv as *mut std::ffi::c_void,
                len,
                t,
                op,
                self.comm,
                stream as sys::cudaStream_t,
            )
        }
        .map(|_| ())
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // Abort rather than destroy: destroy waits for operations that a dead peer never ends.
        unsafe {
            let _ = result::comm_abort(self.comm);
        }
    }
}
