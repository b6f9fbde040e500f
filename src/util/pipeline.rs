//! An ordered, bounded parallel map: items `0..count` are produced by worker threads in any order
//! and consumed on the calling thread strictly in index order, with at most `window` items produced
//! ahead of the consumer. This is what keeps every core busy while memory stays bounded: no batch
//! barriers (a slow item delays only its own slot), and no more than `window` results in memory.
//! A SIGINT or SIGTERM (`crate::util::interrupt`) stops it like an error: the workers take no new item,
//! and the consumer returns `Error::Interrupted` without waiting for the items in progress.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// How often a consumer waiting for an item looks at the interrupt flag.
const POLL: Duration = Duration::from_millis(50);

struct State<T, E> {
    next: usize,
    consumed: usize,
    ready: BTreeMap<usize, Result<T, E>>,
    stop: bool,
}

/// Run `produce(i)` for every `i < count` on `workers` threads, and `consume(i, item)` on this thread
/// in order. Stops at the first error (of either side), or at an interruption, and returns it;
/// items already produced past the error are dropped.
pub fn ordered_map<T, E, P, C>(
    count: usize,
    workers: usize,
    window: usize,
    produce: P,
    mut consume: C,
) -> Result<(), E>
where
    T: Send,
    E: Send + From<crate::Error>,
    P: Fn(usize) -> Result<T, E> + Sync,
    C: FnMut(usize, T) -> Result<(), E>,
{
    let window = window.max(1);
    let state = Mutex::new(State {
        next: 0,
        consumed: 0,
        ready: BTreeMap::new(),
        stop: false,
    });
    let changed = Condvar::new();
    std::thread::scope(|s| {
        for _ in 0..workers.clamp(1, count.max(1)) {
            s.spawn(|| loop {
                let i = {
                    let mut st = state.lock().unwrap();
                    while !st.stop && st.next < count && st.next >= st.consumed + window {
                        st = changed.wait(st).unwrap();
                    }
                    if st.stop || st.next >= count || crate::util::interrupt::requested().is_some()
                    {
                        return;
                    }
                    st.next += 1;
                    st.next - 1
                };
                let r = produce(i);
                let mut st = state.lock().unwrap();
                st.ready.insert(i, r);
                changed.notify_all();
            });
        }
        let result = (|| {
            for i in 0..count {
                let item = {
                    let mut st = state.lock().unwrap();
                    loop {
                        crate::util::interrupt::check()?;
                        if let Some(r) = st.ready.remove(&i) {
                            st.consumed = i + 1;
                            changed.notify_all();
                            break r;
                        }
                        // Woken by a worker, or after a while to look at the interrupt flag.
                        st = changed.wait_timeout(st, POLL).unwrap().0;
                    }
                };
                consume(i, item?)?;
            }
            Ok(())
        })();
        let mut st = state.lock().unwrap();
        st.stop = true;
        st.ready.clear();
        changed.notify_all();
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn consumes_in_order_with_bounded_lookahead() {
        let consumed = AtomicUsize::new(0);
        let max_ahead = AtomicUsize::new(0);
        let mut seen = Vec::new();
        ordered_map::<usize, crate::Error, _, _>(
            500,
            4,
            3,
            |i| {
                let ahead = i - consumed.load(Ordering::SeqCst);
                max_ahead.fetch_max(ahead, Ordering::SeqCst);
                if i % 7 == 0 {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                Ok(i * 2)
            },
            |i, v| {
                seen.push(v);
                consumed.store(i + 1, Ordering::SeqCst);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(seen, (0..500).map(|i| i * 2).collect::<Vec<_>>());
        assert!(max_ahead.load(Ordering::SeqCst) <= 3);
    }

    #[test]
    fn stops_at_the_first_error() {
        let produced = AtomicUsize::new(0);
        let r = ordered_map(
            10_000,
            2,
            4,
            |i| {
                produced.fetch_add(1, Ordering::SeqCst);
                if i == 50 {
                    Err(crate::Error::Invalid(format!("bad {i}")))
                } else {
                    Ok(i)
                }
            },
            |_, _| Ok(()),
        );
        assert_eq!(r.unwrap_err().to_string(), "bad 50");
        assert!(produced.load(Ordering::SeqCst) < 100);
        let r = ordered_map(100, 2, 4, Ok::<usize, crate::Error>, |i, _| {
            if i == 9 {
                Err(crate::Error::Invalid("consumer".into()))
            } else {
                Ok(())
            }
        });
        assert_eq!(r.unwrap_err().to_string(), "consumer");
    }
}

/// `dst.copy_from_slice(src)` on every core, in 1 MiB pieces: a batch of large images is tens of
/// MB, more than one thread copies in the time of a GPU step.
pub fn copy_parallel(dst: &mut [u8], src: &[u8]) {
    use rayon::prelude::*;
    // Below a few megabytes the hand-off to other threads costs more than it saves.
    if src.len() < 4 << 20 {
        dst.copy_from_slice(src);
        return;
    }
    dst.par_chunks_mut(1 << 20)
        .zip(src.par_chunks(1 << 20))
        .for_each(|(d, s)| d.copy_from_slice(s));
}
