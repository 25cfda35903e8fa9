//! Deterministic randomness as a pure function of (seed, purpose): a SplitMix64
//! stream whose state is derived with blake3. Written out here rather than taken
//! from a crate so the bytes a seed produces can never change with a dependency.

/// A reproducible stream of random numbers for one purpose.
#[derive(Debug, Clone)]
pub struct Stream {
    state: u64,
}

impl Stream {
    /// The stream for `purpose` under `seed` (e.g. `("stock-arithmetic/test-ood", 7)`).
    pub fn new(seed: u64, purpose: &str) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(b"orchestrate.rng.v1\0");
        h.update(&seed.to_le_bytes());
        h.update(purpose.as_bytes());
        let bytes = h.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&bytes.as_bytes()[..8]);
        Stream { state: u64::from_le_bytes(first) }
    }

    pub fn next_u64(&mut self) -> u64 {
        // SplitMix64 (Steele, Lea, Flood 2014).
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `lo..=hi`, without modulo bias.
    pub fn int_inclusive(&mut self, lo: u32, hi: u32) -> u32 {
        assert!(lo <= hi, "empty range {lo}..={hi}");
        let span = u64::from(hi - lo) + 1;
        let zone = u64::MAX - (u64::MAX % span);
        loop {
            let x = self.next_u64();
            if x < zone {
                return lo + (x % span) as u32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_depend_on_seed_and_purpose_only() {
        let draws = |seed, purpose| {
            let mut s = Stream::new(seed, purpose);
            (0..4).map(|_| s.next_u64()).collect::<Vec<u64>>()
        };
        let (a, b, c, d) = (draws(1, "x"), draws(1, "x"), draws(2, "x"), draws(1, "y"));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }

    #[test]
    fn int_inclusive_covers_both_ends_and_nothing_outside() {
        let mut s = Stream::new(0, "range");
        let draws: Vec<u32> = (0..2000).map(|_| s.int_inclusive(3, 7)).collect();
        assert!(draws.iter().all(|v| (3..=7).contains(v)));
        for v in 3..=7 {
            assert!(draws.contains(&v), "{v} never drawn");
        }
    }
}
