//! The other ranks of a data-parallel run, as the backend reaches them: NCCL's communicator, or,
//! in tests, ranks of this process (one thread and one backend each, all on one GPU) whose sums
//! meet on the host. The second checks the arithmetic of a multi-rank step (the gradients'
//! average, synchronised batch norm) where only one GPU is at hand.

#[cfg(test)]
use super::dr;
use super::{nccl, Cuda};

pub(super) enum World {
    Nccl(nccl::Comm),
    #[cfg(test)]
    Host(host::Rank),
}

impl Cuda {
    /// `tot` = the sum over the ranks of each rank's `mine` (`len` doubles). Without a world of
    /// several ranks, returns false and leaves `tot` alone.
    pub(super) fn sum_f64_over_world(&mut self, mine: u64, tot: u64, len: usize) -> bool {
        match &self.world {
            None => false,
            Some(World::Nccl(comm)) => {
                if let Err(e) = comm.sum_f64(mine, tot, len, self.stream.cu_stream()) {
                    self.fail(e);
                }
                true
            }
            #[cfg(test)]
            Some(World::Host(r)) => {
                let r = r.clone();
                let v = self.read_back::<f64>(mine, len);
                let s = r.reduce(v, false);
                self.write_raw(tot, &s);
                true
            }
        }
    }

    /// Average the float32 tensors `(address, length)` across the ranks, in place.
    pub(super) fn average_f32_over_world(&mut self, tensors: &[(u64, usize)]) {
        match &self.world {
            None => {}
            Some(World::Nccl(comm)) => {
                if let Err(e) = comm.average_f32(tensors, self.stream.cu_stream()) {
                    self.fail(e);
                }
            }
            #[cfg(test)]
            Some(World::Host(r)) => {
                let r = r.clone();
                let mut all = Vec::new();
                for &(ptr, len) in tensors {
                    all.extend(self.read_back::<f32>(ptr, len).into_iter().map(f64::from));
                }
                let avg = r.reduce(all, true);
                let mut at = 0;
                for &(ptr, len) in tensors {
                    let v: Vec<f32> = avg[at..at + len].iter().map(|&x| x as f32).collect();
                    self.write_raw(ptr, &v);
                    at += len;
                }
            }
        }
    }

    /// Copy host values to device address `ptr`, and wait for it (the values go right after).
    #[cfg(test)]
    fn write_raw<T: Copy>(&mut self, ptr: u64, v: &[T]) {
        if v.is_empty() {
            return;
        }
        let r = unsafe { dr::memcpy_htod_async(ptr, v, self.stream.cu_stream()) };
        if let Err(e) = r {
            self.fail(format!("copying to the GPU: {e:?}"));
        }
        self.sync();
    }

    /// Join a world of ranks of this process (tests): each rank a thread with its own backend.
    #[cfg(test)]
    pub(crate) fn join_host_world(&mut self, rank: host::Rank) {
        self.graphs = false; // a graph cannot replay the host's part of the sums
        self.world = Some(World::Host(rank));
    }
}

#[cfg(test)]
pub(crate) mod host {
    use std::sync::{Arc, Barrier, Mutex};

    /// The meeting point of `size` ranks: each brings its values, all get their sum (added in
    /// rank order, so every rank gets the same bits), as NCCL's all-reduce gives them.
    pub(crate) struct Hub {
        parts: Mutex<Vec<Vec<f64>>>,
        barrier: Barrier,
    }

    #[derive(Clone)]
    pub(crate) struct Rank {
        hub: Arc<Hub>,
        rank: usize,
    }

    /// The ranks of a new world of `size`, one for each thread.
    pub(crate) fn world(size: usize) -> Vec<Rank> {
        let hub = Arc::new(Hub {
            parts: Mutex::new(vec![Vec::new(); size]),
            barrier: Barrier::new(size),
        });
        (0..size)
            .map(|rank| Rank {
                hub: hub.clone(),
                rank,
            })
            .collect()
    }

    impl Rank {
        /// The sum (or with `average` the mean) over the ranks of each one's `v`.
        pub(crate) fn reduce(&self, v: Vec<f64>, average: bool) -> Vec<f64> {
            let h = &self.hub;
            h.parts.lock().unwrap()[self.rank] = v;
            h.barrier.wait();
            let out = {
                let parts = h.parts.lock().unwrap();
                let mut s = parts[0].clone();
                for p in &parts[1..] {
                    assert_eq!(p.len(), s.len(), "ranks brought different lengths");
                    for (a, b) in s.iter_mut().zip(p) {
                        *a += b;
                    }
                }
                if average {
                    let k = parts.len() as f64;
                    s.iter_mut().for_each(|a| *a /= k);
                }
                s
            };
            // Nobody brings the next values before every rank has read these.
            h.barrier.wait();
            out
        }
    }
}
