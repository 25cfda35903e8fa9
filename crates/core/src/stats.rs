//! Bootstrap intervals for the differences the results table reports: a
//! percentile bootstrap (Efron & Tibshirani, ch. 13), seeded so the same
//! inputs always give the same interval (results are cached by their inputs).

use serde::{Deserialize, Serialize};

/// How many resamples every interval uses.
pub const RESAMPLES: usize = 10_000;

/// A difference with its 95 % percentile-bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interval {
    /// The difference on the data as observed.
    pub estimate: f64,
    pub low: f64,
    pub high: f64,
    pub confidence: f64,
    pub resamples: usize,
}

impl Interval {
    /// Whether the interval lies wholly on one side of zero.
    pub fn excludes_zero(&self) -> bool {
        self.low > 0.0 || self.high < 0.0
    }
}

impl std::fmt::Display for Interval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:+.3} (95% bootstrap interval [{:+.3}, {:+.3}], {} resamples)",
            self.estimate, self.low, self.high, self.resamples
        )
    }
}

/// SplitMix64: small, fast, and enough for resampling indices.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// The mean, or `None` for no values (undefined, never 0).
pub fn mean_of(xs: impl IntoIterator<Item = f64>) -> Option<f64> {
    let (mut sum, mut n) = (0.0, 0usize);
    for x in xs {
        sum += x;
        n += 1;
    }
    (n > 0).then(|| sum / n as f64)
}

/// The sample standard deviation (n − 1, as `torch.std` and numpy's `ddof=1`);
/// `None` below two values.
pub fn sample_std(xs: &[f64]) -> Option<f64> {
    let m = mean_of(xs.iter().copied())?;
    (xs.len() >= 2).then(|| (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (xs.len() - 1) as f64).sqrt())
}

/// The 2.5 % and 97.5 % percentiles of the resampled statistics.
fn percentile_interval(estimate: f64, mut stats: Vec<f64>) -> Interval {
    stats.sort_by(f64::total_cmp);
    let at = |q: f64| stats[((q * (stats.len() - 1) as f64).round() as usize).min(stats.len() - 1)];
    Interval { estimate, low: at(0.025), high: at(0.975), confidence: 0.95, resamples: stats.len() }
}

/// `mean(after) − mean(before)` for two independent samples, each resampled
/// with replacement on its own. `None` when either is empty.
pub fn mean_difference(before: &[f64], after: &[f64], seed: u64) -> Option<Interval> {
    if before.is_empty() || after.is_empty() {
        return None;
    }
    let mut rng = SplitMix(seed);
    let stats = (0..RESAMPLES)
        .map(|_| {
            let a: f64 = (0..before.len()).map(|_| before[rng.below(before.len())]).sum::<f64>() / before.len() as f64;
            let b: f64 = (0..after.len()).map(|_| after[rng.below(after.len())]).sum::<f64>() / after.len() as f64;
            b - a
        })
        .collect();
    Some(percentile_interval(mean(after) - mean(before), stats))
}

/// `mean(y − x)` over paired observations (the same problems under two
/// policies), resampling the pairs. `None` when there are none.
pub fn paired_difference(pairs: &[(f64, f64)], seed: u64) -> Option<Interval> {
    if pairs.is_empty() {
        return None;
    }
    let diffs: Vec<f64> = pairs.iter().map(|(x, y)| y - x).collect();
    let mut rng = SplitMix(seed);
    let stats = (0..RESAMPLES)
        .map(|_| (0..diffs.len()).map(|_| diffs[rng.below(diffs.len())]).sum::<f64>() / diffs.len() as f64)
        .collect();
    Some(percentile_interval(mean(&diffs), stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_constant_shift_has_a_zero_width_interval_at_the_shift() {
        let pairs: Vec<(f64, f64)> = (0..50).map(|i| (i as f64, i as f64 + 1.0)).collect();
        let i = paired_difference(&pairs, 1).unwrap();
        assert_eq!((i.estimate, i.low, i.high), (1.0, 1.0, 1.0));
        assert!(i.excludes_zero());
        let same = mean_difference(&[0.5; 20], &[0.5; 20], 1).unwrap();
        assert_eq!((same.estimate, same.low, same.high), (0.0, 0.0, 0.0));
        assert!(!same.excludes_zero());
    }

    #[test]
    fn the_interval_matches_the_normal_approximation_on_a_large_sample() {
        // 400 paired problems: 60 solved only by y, 20 only by x, the rest tied.
        // The normal interval is estimate ± 1.96·sd/√n.
        let mut pairs = vec![(0.0, 1.0); 60];
        pairs.extend(vec![(1.0, 0.0); 20]);
        pairs.extend(vec![(1.0, 1.0); 100]);
        pairs.extend(vec![(0.0, 0.0); 220]);
        let n = pairs.len() as f64;
        let diffs: Vec<f64> = pairs.iter().map(|(x, y)| y - x).collect();
        let m = mean(&diffs);
        let sd = (diffs.iter().map(|d| (d - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        let half = 1.96 * sd / n.sqrt();
        let i = paired_difference(&pairs, 7).unwrap();
        assert!((i.estimate - 0.1).abs() < 1e-12);
        assert!((i.low - (m - half)).abs() < 0.15 * half, "{i:?} vs ±{half}");
        assert!((i.high - (m + half)).abs() < 0.15 * half, "{i:?} vs ±{half}");
    }

    #[test]
    fn the_same_inputs_give_the_same_interval_and_empty_ones_none() {
        let a = [0.1, 0.4, 0.2, 0.0, 0.3];
        let b = [0.5, 0.2, 0.6, 0.4];
        assert_eq!(mean_difference(&a, &b, 3), mean_difference(&a, &b, 3));
        assert_eq!(mean_difference(&[], &b, 3), None);
        assert_eq!(paired_difference(&[], 3), None);
    }
}
