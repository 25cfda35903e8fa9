//! Training artifacts readable without libtorch: resumable state files and
//! their comparison (`check.resume`). The training loops themselves run in the
//! worker (`crates/torch/src/train/`).

pub mod metrics;
pub mod params;
pub mod state;

/// A = (r − mean) / (std + 1e-8) with the population std (correction 0).
/// A group whose rewards are all equal gets exactly zero advantages: they are
/// reported as such, never "fixed".
pub fn group_advantages(rewards: &[f64]) -> Vec<f64> {
    let n = rewards.len() as f64;
    if rewards.is_empty() {
        return Vec::new();
    }
    if rewards.iter().all(|r| *r == rewards[0]) {
        return vec![0.0; rewards.len()];
    }
    let mean = rewards.iter().sum::<f64>() / n;
    let var = rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n;
    rewards.iter().map(|r| (r - mean) / (var.sqrt() + 1e-8)).collect()
}
