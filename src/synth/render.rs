//! Rendering a sample by the generator's version: version 1 (`generator`, whose colours give the
//! class away) or version 2 (`pattern_only`), each compiled twice (baseline and AVX2). Sits above
//! both so that neither imports the other.

use super::generator::{Generator, Scene, Version};
use crate::format::shard::Block;

impl Generator {
    /// Render one sample into `out` (C*H*W bytes) and return its label. `scratch` is reused between
    /// calls to avoid an allocation per sample.
    #[inline]
    pub fn render(&self, split: u64, index: u64, out: &mut [u8], scratch: &mut Vec<f32>) -> u32 {
        self.render_scene(split, index, out, scratch).label
    }

    /// `render`, returning what the sample draws: its label, and where its discs lie (for the
    /// targets of `--task mask|labels|values`).
    pub fn render_scene(
        &self,
        split: u64,
        index: u64,
        out: &mut [u8],
        scratch: &mut Vec<f32>,
    ) -> Scene {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { self.render_avx2(split, index, out, scratch) };
        }
        self.render_any(split, index, out, scratch)
    }

    /// The same code compiled for AVX2: twice the vector width. Only IEEE-exact operations are used
    /// (no fused multiply-add, no library transcendentals), so both versions give identical bytes.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn render_avx2(
        &self,
        split: u64,
        index: u64,
        out: &mut [u8],
        scratch: &mut Vec<f32>,
    ) -> Scene {
        self.render_any(split, index, out, scratch)
    }

    #[inline(always)]
    pub(super) fn render_any(
        &self,
        split: u64,
        index: u64,
        out: &mut [u8],
        scratch: &mut Vec<f32>,
    ) -> Scene {
        match self.version {
            Version::V1 => self.render_v1(split, index, out, scratch),
            Version::V2 { difficulty } => {
                super::pattern_only::render(self, difficulty as f32, split, index, out, scratch)
            }
        }
    }

    /// Render samples `start .. start + n` of a split as one block.
    pub fn render_block(&self, split: u64, start: u64, n: usize) -> Block {
        let sb = self.spec.bytes();
        let mut block = Block::zeroed(n, sb);
        let mut scratch = Vec::new();
        for i in 0..n {
            let label = self.render(split, start + i as u64, block.sample_mut(i), &mut scratch);
            block.set_label(i, label);
        }
        block
    }
}
