//! The filter of codec `pred` (formats/shard.md, "Codec pred"): each value of a u8/u16 plane is
//! replaced by its difference from a prediction made of its decoded neighbours (left, up, or
//! LOCO-I's median edge detector), optionally after taking green from red and blue, so that zstd
//! sees small numbers. The planes of a block are filtered 16 at a time, their values interleaved
//! (value `i` of the 16 planes side by side), which lets one vector instruction serve 16 planes:
//! the left-to-right dependency of a row is what keeps a single plane from vectorising.
//!
//! Everything here is lossless and total: any residual bytes decode to some pixels; whether they
//! are the right ones is the block's checksum's to say.

/// Planes filtered side by side.
const LANES: usize = 16;

/// `method` byte: 0 stores the bytes as they are; 1 left, 2 up, 3 median; +0x10 with the
/// colour step (3 channels only).
pub const PLAIN: u8 = 0;
const LEFT: u8 = 1;
const UP: u8 = 2;
const MED: u8 = 3;
pub const COLOUR: u8 = 0x10;

/// The planes of a block: `planes` planes (samples x channels) of `rows` x `width` values of
/// 1 or 2 bytes, `channels` a sample.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    pub planes: usize,
    pub channels: usize,
    pub rows: usize,
    pub width: usize,
    pub wide: bool,
}

impl Geometry {
    fn plane(&self) -> usize {
        self.rows * self.width
    }
    fn bytes(&self) -> usize {
        self.planes * self.plane() * if self.wide { 2 } else { 1 }
    }
}

/// Whether `method` is one a block of geometry `g` (None for float samples) may carry.
pub fn valid(method: u8, g: Option<&Geometry>) -> bool {
    let (filter, colour) = (method & 0x0f, method & COLOUR != 0);
    if method & !(COLOUR | 0x0f) != 0 || filter > MED {
        return false;
    }
    match g {
        None => method == PLAIN,
        Some(g) => !(colour && (g.channels != 3 || filter == PLAIN)),
    }
}

trait Px: Copy + Ord + Default {
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn sat_add(self, o: Self) -> Self;
    fn sat_sub(self, o: Self) -> Self;
    /// |v| of the value read as a signed difference, for the cost estimate.
    fn mag(self) -> u32;
}
macro_rules! px {
    ($t:ty, $s:ty) => {
        impl Px for $t {
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            #[inline(always)]
            fn sat_add(self, o: Self) -> Self {
                self.saturating_add(o)
            }
            #[inline(always)]
            fn sat_sub(self, o: Self) -> Self {
                self.saturating_sub(o)
            }
            fn mag(self) -> u32 {
                (self as $s).unsigned_abs() as u32
            }
        }
    };
}
px!(u8, i8);
px!(u16, i16);

/// LOCO-I's median edge detector: min(a, b) where c >= max(a, b), max(a, b) where c <= min(a,
/// b), else a + b - c. That is the median of a, b and a + b - c, and clamping a + b - c to the
/// values' range leaves the median as it is; computed so, with saturating steps, the decoder's
/// chain from one value to the next (`a`) is four vector instructions without a branch.
#[inline(always)]
fn med<T: Px>(a: T, b: T, c: T) -> T {
    let t = a.sat_add(b.sat_sub(c)).sat_sub(c.sat_sub(b));
    a.min(b).max(a.max(b).min(t))
}

/// The prediction of value `x` of a row from its left neighbour `a`, the one above `b` and
/// above-left `c`. The first row predicts from the left (0 at the very first value), the first
/// column from above, whatever the filter.
#[inline(always)]
fn predict<T: Px, const F: u8>(a: T, b: T, c: T) -> T {
    match F {
        LEFT => a,
        UP => b,
        _ => med(a, b, c),
    }
}

/// Residuals of one row of `L` interleaved planes (`cur`, with `prev` the row above, None on the
/// first row) into `out`.
#[inline(always)]
fn filter_row<T: Px, const L: usize, const F: u8>(prev: Option<&[T]>, cur: &[T], out: &mut [T]) {
    let w = cur.len() / L;
    match prev {
        None => {
            out[..L].copy_from_slice(&cur[..L]);
            for x in 1..w {
                for l in 0..L {
                    out[x * L + l] = cur[x * L + l].sub(cur[(x - 1) * L + l]);
                }
            }
        }
        Some(p) => {
            for l in 0..L {
                out[l] = cur[l].sub(p[l]);
            }
            for x in 1..w {
                for l in 0..L {
                    let i = x * L + l;
                    out[i] = cur[i].sub(predict::<T, F>(cur[i - L], p[i], p[i - L]));
                }
            }
        }
    }
}

/// Inverse of `filter_row` for `K` groups at once: values of the row of group `k` into
/// `cur[k * w * L..]` from residuals `res[k]`, with `prev` the row above laid out as `cur`. The
/// left neighbours are carried in `a` (registers) rather than read back from `cur`, which would
/// put a store-to-load round trip into the chain from one value to the next; the `K` groups'
/// chains are independent, so the processor runs them side by side.
#[inline(always)]
fn unfilter_rows<T: Px, const L: usize, const F: u8, const K: usize>(
    prev: Option<&[T]>,
    res: [&[T]; K],
    cur: &mut [T],
) {
    let wl = cur.len() / K;
    let w = wl / L;
    let lanes = |v: &[T], x: usize| -> [T; L] { v[x * L..(x + 1) * L].try_into().unwrap() };
    let mut a: [[T; L]; K] = std::array::from_fn(|k| lanes(res[k], 0));
    let mut c: [[T; L]; K] = [[T::default(); L]; K];
    if let Some(p) = prev {
        for k in 0..K {
            c[k] = lanes(&p[k * wl..], 0);
            for l in 0..L {
                a[k][l] = a[k][l].add(c[k][l]);
            }
        }
    }
    for k in 0..K {
        cur[k * wl..k * wl + L].copy_from_slice(&a[k]);
    }
    for x in 1..w {
        for k in 0..K {
            let r = lanes(res[k], x);
            match prev {
                None => {
                    for l in 0..L {
                        a[k][l] = r[l].add(a[k][l]);
                    }
                }
                Some(p) => {
                    let b = lanes(&p[k * wl..], x);
                    for l in 0..L {
                        a[k][l] = r[l].add(predict::<T, F>(a[k][l], b[l], c[k][l]));
                    }
                    c[k] = b;
                }
            }
            cur[k * wl + x * L..k * wl + (x + 1) * L].copy_from_slice(&a[k]);
        }
    }
}

/// Element access to a block's pixels as `T` (little-endian pairs for u16).
trait Planes<T> {
    fn at(&self, i: usize) -> T;
}
impl Planes<u8> for [u8] {
    #[inline(always)]
    fn at(&self, i: usize) -> u8 {
        self[i]
    }
}
impl Planes<u16> for [u8] {
    #[inline(always)]
    fn at(&self, i: usize) -> u16 {
        u16::from_le_bytes([self[2 * i], self[2 * i + 1]])
    }
}
trait PutPx: Px {
    fn put(px: &mut [u8], i: usize, v: Self);
    /// Row values of 16 interleaved planes (`row`) into the planes (plane `l` from
    /// `at + l * plane`), 16 columns at a time where there is a fast way: the columns done.
    /// `tmp` holds the row's planes one after the other on the way.
    fn scatter16(
        _row: &[Self],
        _px: &mut [u8],
        _at: usize,
        _plane: usize,
        _tmp: &mut Vec<u8>,
    ) -> usize {
        0
    }
    /// The inverse of `scatter16`: the row of 16 planes, interleaved, into `row`.
    fn gather16(_px: &[u8], _at: usize, _plane: usize, _row: &mut [Self]) -> usize {
        0
    }
    /// Residual of lane value `v` as stored: u8 as is, u16 zigzagged (small magnitudes, either
    /// sign, have a zero high byte) and split into a low-byte half and a high-byte half.
    fn store(v: &[Self], out: &mut Vec<u8>);
    fn load(bytes: &[u8], out: &mut [Self]);
    /// The residuals stored in `bytes`, read in place where they need no conversion (u8), else
    /// through `scratch`.
    fn residuals<'a>(bytes: &'a [u8], scratch: &'a mut Vec<Self>) -> &'a [Self];
    /// Plane `c` less (`forward`) or plus the green plane `g`, value by value.
    fn colour_plane(c: &mut [u8], g: &[u8], forward: bool);
}
impl PutPx for u8 {
    #[inline(always)]
    fn put(px: &mut [u8], i: usize, v: u8) {
        px[i] = v;
    }
    #[cfg(target_arch = "x86_64")]
    fn scatter16(row: &[u8], px: &mut [u8], at: usize, plane: usize, tmp: &mut Vec<u8>) -> usize {
        let w = row.len() / LANES;
        let whole = w / 16 * 16;
        assert!(at + 15 * plane + whole <= px.len());
        tmp.resize(16 * whole, 0);
        for x in (0..whole).step_by(16) {
            let src: &[u8; 256] = row[x * 16..x * 16 + 256].try_into().unwrap();
            let t = transpose16(src);
            for (l, v) in t.iter().enumerate() {
                tmp[l * whole + x..l * whole + x + 16].copy_from_slice(v);
            }
        }
        // Whole row segments, plane after plane: 16-byte stores straight into 16 planes a
        // power of two apart fall in one cache set and evict each other's lines between the
        // four stores that fill a line.
        for (l, v) in tmp.chunks_exact(whole.max(1)).enumerate().take(16) {
            px[at + l * plane..at + l * plane + whole].copy_from_slice(v);
        }
        whole
    }
    #[cfg(target_arch = "x86_64")]
    fn gather16(px: &[u8], at: usize, plane: usize, row: &mut [u8]) -> usize {
        let w = row.len() / LANES;
        let whole = w / 16 * 16;
        let mut src = [0u8; 256];
        for x in (0..whole).step_by(16) {
            for l in 0..16 {
                src[l * 16..l * 16 + 16]
                    .copy_from_slice(&px[at + l * plane + x..at + l * plane + x + 16]);
            }
            for (k, v) in transpose16(&src).iter().enumerate() {
                row[(x + k) * 16..(x + k) * 16 + 16].copy_from_slice(v);
            }
        }
        whole
    }
    fn store(v: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(v);
    }
    fn load(bytes: &[u8], out: &mut [u8]) {
        out.copy_from_slice(bytes);
    }
    fn residuals<'a>(bytes: &'a [u8], _scratch: &'a mut Vec<u8>) -> &'a [u8] {
        bytes
    }
    fn colour_plane(c: &mut [u8], g: &[u8], forward: bool) {
        let pairs = c.iter_mut().zip(g);
        if forward {
            pairs.for_each(|(v, &g)| *v = v.wrapping_sub(g));
        } else {
            pairs.for_each(|(v, &g)| *v = v.wrapping_add(g));
        }
    }
}
impl PutPx for u16 {
    #[inline(always)]
    fn put(px: &mut [u8], i: usize, v: u16) {
        px[2 * i..2 * i + 2].copy_from_slice(&v.to_le_bytes());
    }
    fn store(v: &[u16], out: &mut Vec<u8>) {
        let zz = |r: u16| ((r << 1) ^ ((r as i16 >> 15) as u16)).to_le_bytes();
        out.extend(v.iter().map(|&r| zz(r)[0]));
        out.extend(v.iter().map(|&r| zz(r)[1]));
    }
    fn load(bytes: &[u8], out: &mut [u16]) {
        let (lo, hi) = bytes.split_at(out.len());
        for ((o, &l), &h) in out.iter_mut().zip(lo).zip(hi) {
            let z = u16::from_le_bytes([l, h]);
            *o = (z >> 1) ^ (z & 1).wrapping_neg();
        }
    }
    fn residuals<'a>(bytes: &'a [u8], scratch: &'a mut Vec<u16>) -> &'a [u16] {
        scratch.clear();
        scratch.resize(bytes.len() / 2, 0);
        Self::load(bytes, scratch);
        scratch
    }
    fn colour_plane(c: &mut [u8], g: &[u8], forward: bool) {
        for (v, g) in c.chunks_exact_mut(2).zip(g.chunks_exact(2)) {
            let (x, y) = (
                u16::from_le_bytes([v[0], v[1]]),
                u16::from_le_bytes([g[0], g[1]]),
            );
            let r = if forward {
                x.wrapping_sub(y)
            } else {
                x.wrapping_add(y)
            };
            v.copy_from_slice(&r.to_le_bytes());
        }
    }
}

/// The 16x16 byte matrix `m` (row after row) transposed, with SSE2 (every x86-64 has it).
/// Four rounds of interleaving rows 2i and 2i+1 byte by byte (results to i and i+8) move the
/// value of row r, column c to row rev(c), column rev(r), rev reversing 4 bits: rows are loaded
/// and stored in rev order to make that a transpose.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn transpose16(m: &[u8; 256]) -> [[u8; 16]; 16] {
    use std::arch::x86_64::*;
    const REV: [usize; 16] = [0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15];
    // SAFETY: SSE2 is part of x86-64; loads and stores are unaligned ones within the arrays.
    unsafe {
        let mut r: [__m128i; 16] =
            std::array::from_fn(|i| _mm_loadu_si128(m.as_ptr().add(16 * REV[i]) as *const __m128i));
        for _ in 0..4 {
            let mut t = [_mm_setzero_si128(); 16];
            for i in 0..8 {
                t[i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
                t[i + 8] = _mm_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
            }
            r = t;
        }
        let mut out = [[0u8; 16]; 16];
        for (c, o) in out.iter_mut().enumerate() {
            _mm_storeu_si128(o.as_mut_ptr() as *mut __m128i, r[REV[c]]);
        }
        out
    }
}

/// The groups of planes filtered together: whole groups of 16, then the rest one by one.
fn groups(planes: usize) -> impl Iterator<Item = (usize, usize)> {
    let full = planes / LANES;
    (0..full)
        .map(|g| (g * LANES, LANES))
        .chain((full * LANES..planes).map(|p| (p, 1)))
}

fn encode_groups<T: PutPx>(px: &[u8], g: &Geometry, filter: u8, out: &mut Vec<u8>)
where
    [u8]: Planes<T>,
{
    match filter {
        LEFT => encode_groups_with::<T, LEFT>(px, g, out),
        UP => encode_groups_with::<T, UP>(px, g, out),
        _ => encode_groups_with::<T, MED>(px, g, out),
    }
}

fn encode_groups_with<T: PutPx, const F: u8>(px: &[u8], g: &Geometry, out: &mut Vec<u8>)
where
    [u8]: Planes<T>,
{
    for (first, lanes) in groups(g.planes) {
        if lanes == LANES {
            encode_group::<T, LANES, F>(px, g, first, out);
        } else {
            encode_group::<T, 1, F>(px, g, first, out);
        }
    }
}

fn encode_group<T: PutPx, const L: usize, const F: u8>(
    px: &[u8],
    g: &Geometry,
    first: usize,
    out: &mut Vec<u8>,
) where
    [u8]: Planes<T>,
{
    let (w, plane) = (g.width, g.plane());
    let mut rows = [vec![T::default(); w * L], vec![T::default(); w * L]];
    let mut res = vec![T::default(); plane * L];
    for y in 0..g.rows {
        let (a, b) = rows.split_at_mut(1);
        let (prev, cur) = if y % 2 == 0 {
            (&b[0], &mut a[0])
        } else {
            (&a[0], &mut b[0])
        };
        let done = if L == LANES {
            T::gather16(px, first * plane + y * w, plane, cur)
        } else {
            0
        };
        for x in done..w {
            for l in 0..L {
                cur[x * L + l] = px.at((first + l) * plane + y * w + x);
            }
        }
        let r = &mut res[y * w * L..(y + 1) * w * L];
        filter_row::<T, L, F>((y > 0).then_some(&prev[..]), cur, r);
    }
    T::store(&res, out);
}

/// The filter undone group by group; with `colour`, the colour step undone on each sample as
/// soon as its planes are, while they are still in the cache.
fn decode_groups<T: PutPx>(stored: &[u8], g: &Geometry, filter: u8, colour: bool, px: &mut [u8]) {
    match filter {
        LEFT => decode_groups_with::<T, LEFT>(stored, g, colour, px),
        UP => decode_groups_with::<T, UP>(stored, g, colour, px),
        _ => decode_groups_with::<T, MED>(stored, g, colour, px),
    }
}

fn decode_groups_with<T: PutPx, const F: u8>(
    stored: &[u8],
    g: &Geometry,
    colour: bool,
    px: &mut [u8],
) {
    let size = if g.wide { 2 } else { 1 };
    let mut coloured = 0;
    let mut at = 0;
    let (mut res, mut res2): (Vec<T>, Vec<T>) = (Vec::new(), Vec::new());
    let mut rows = Rows::default();
    let all: Vec<_> = groups(g.planes).collect();
    let mut i = 0;
    while i < all.len() {
        let (first, lanes) = all[i];
        let n = lanes * g.plane() * size;
        if lanes == LANES && all.get(i + 1).is_some_and(|&(_, l)| l == LANES) {
            // Two whole groups side by side.
            let r1 = T::residuals(&stored[at..at + n], &mut res);
            let r2 = T::residuals(&stored[at + n..at + 2 * n], &mut res2);
            decode_group::<T, LANES, F, 2>([r1, r2], g, first, &mut rows, px);
            at += 2 * n;
            i += 2;
        } else {
            let r = T::residuals(&stored[at..at + n], &mut res);
            if lanes == LANES {
                decode_group::<T, LANES, F, 1>([r], g, first, &mut rows, px);
            } else {
                decode_group::<T, 1, F, 1>([r], g, first, &mut rows, px);
            }
            at += n;
            i += 1;
        }
        if colour {
            let done = all.get(i).map_or(g.planes, |&(f, _)| f) / 3;
            self::colour::<T>(px, g, coloured..done, false);
            coloured = done;
        }
    }
}

/// A decoder's row buffers, reused from group to group.
struct Rows<T> {
    prev: Vec<T>,
    cur: Vec<T>,
    tmp: Vec<u8>,
}
impl<T> Default for Rows<T> {
    fn default() -> Self {
        Rows {
            prev: Vec::new(),
            cur: Vec::new(),
            tmp: Vec::new(),
        }
    }
}

/// `K` consecutive groups of `L` planes from plane `first`, from their residuals `res`.
fn decode_group<T: PutPx, const L: usize, const F: u8, const K: usize>(
    res: [&[T]; K],
    g: &Geometry,
    first: usize,
    rows: &mut Rows<T>,
    px: &mut [u8],
) {
    let (w, plane) = (g.width, g.plane());
    let wl = w * L;
    rows.prev.resize(K * wl, T::default());
    rows.cur.resize(K * wl, T::default());
    for y in 0..g.rows {
        let r: [&[T]; K] = std::array::from_fn(|k| &res[k][y * wl..(y + 1) * wl]);
        let prev = (y > 0).then_some(&rows.prev[..K * wl]);
        unfilter_rows::<T, L, F, K>(prev, r, &mut rows.cur[..K * wl]);
        for k in 0..K {
            let cur = &rows.cur[k * wl..(k + 1) * wl];
            let at = (first + k * L) * plane + y * w;
            let done = if L == LANES {
                T::scatter16(cur, px, at, plane, &mut rows.tmp)
            } else {
                0
            };
            for l in 0..L {
                for x in done..w {
                    T::put(px, at + l * plane + x, cur[x * L + l]);
                }
            }
        }
        std::mem::swap(&mut rows.prev, &mut rows.cur);
    }
}

/// Take green from red and blue (`forward`), or give it back, in `samples` of `px`.
fn colour<T: PutPx>(px: &mut [u8], g: &Geometry, samples: std::ops::Range<usize>, forward: bool) {
    let bytes = g.plane() * if g.wide { 2 } else { 1 };
    for s in samples {
        let (c0, rest) = px[s * 3 * bytes..(s + 1) * 3 * bytes].split_at_mut(bytes);
        let (c1, c2) = rest.split_at_mut(bytes);
        for c in [c0, c2] {
            T::colour_plane(c, c1, forward);
        }
    }
}

/// Append the stored form of pixels `px` under `method` to `out` (as many bytes as `px`).
pub fn encode(px: &[u8], g: &Geometry, method: u8, out: &mut Vec<u8>) {
    debug_assert_eq!(px.len(), g.bytes());
    let filter = method & 0x0f;
    if filter == PLAIN {
        out.extend_from_slice(px);
        return;
    }
    let mut owned;
    let px = if method & COLOUR != 0 {
        owned = px.to_vec();
        let all = 0..g.planes / 3;
        if g.wide {
            colour::<u16>(&mut owned, g, all, true)
        } else {
            colour::<u8>(&mut owned, g, all, true)
        }
        &owned[..]
    } else {
        px
    };
    if g.wide {
        encode_groups::<u16>(px, g, filter, out)
    } else {
        encode_groups::<u8>(px, g, filter, out)
    }
}

/// Pixels from their stored form `stored` (exactly `g`'s bytes) under a `valid` method, into `px`.
pub fn decode(stored: &[u8], g: &Geometry, method: u8, px: &mut [u8]) {
    debug_assert_eq!(stored.len(), g.bytes());
    let filter = method & 0x0f;
    if filter == PLAIN {
        px.copy_from_slice(stored);
        return;
    }
    let colour = method & COLOUR != 0;
    if g.wide {
        decode_groups::<u16>(stored, g, filter, colour, px);
    } else {
        decode_groups::<u8>(stored, g, filter, colour, px);
    }
}

/// The filter (and colour step) that leaves the smallest residuals on a sample of the block's
/// planes: the sum of their magnitudes, as PNG encoders choose.
pub fn choose(px: &[u8], g: &Geometry) -> u8 {
    // Up to 16 planes (whole samples) of the block are enough to tell.
    let take = (16 / g.channels.max(1)).max(1) * g.channels;
    let sub = Geometry {
        planes: g.planes.min(take),
        ..*g
    };
    let px = &px[..sub.bytes()];
    let mut best = (u64::MAX, LEFT);
    let colours: &[u8] = if g.channels == 3 { &[0, COLOUR] } else { &[0] };
    for &c in colours {
        for f in [LEFT, UP, MED] {
            let mut out = Vec::with_capacity(px.len());
            encode(px, &sub, f | c, &mut out);
            let cost = if g.wide {
                cost::<u16>(&out, &sub)
            } else {
                out.iter().map(|&b| b.mag() as u64).sum()
            };
            if cost < best.0 {
                best = (cost, f | c);
            }
        }
    }
    best.1
}

fn cost<T: PutPx>(stored: &[u8], g: &Geometry) -> u64 {
    let mut v = vec![T::default(); stored.len() / 2];
    let mut total = 0;
    let mut at = 0;
    for (_, lanes) in groups(g.planes) {
        let n = lanes * g.plane();
        T::load(&stored[at..at + 2 * n], &mut v[..n]);
        total += v[..n].iter().map(|r| r.mag() as u64).sum::<u64>();
        at += 2 * n;
    }
    total
}

#[cfg(test)]
#[path = "pred_tests.rs"]
mod tests;
