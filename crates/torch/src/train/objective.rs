//! The GRPO objective of shared/seeds/003 ("Du groupe à l'avantage", "La KL
//! exacte sur les préfixes visités"): group-normalized advantages, the clipped
//! surrogate, the exact KL to the reference at every visited prefix, and the
//! reduction tokens → responses → prompts.

use tch::Tensor;

pub use orchestrate_core::train::group_advantages;

/// Per-token min(ρA, clip(ρ, 1−ε, 1+ε)A), ρ = exp(logp − logp_old). Shapes:
/// logp, old (rows, tokens); advantages (rows). Also returns which tokens were clipped.
pub fn clipped_surrogate(logp: &Tensor, old: &Tensor, advantages: &Tensor, eps: f64) -> (Tensor, Tensor) {
    let ratio = (logp - old).exp();
    let a = advantages.unsqueeze(1);
    let unclipped = &ratio * &a;
    let clipped = ratio.clamp(1.0 - eps, 1.0 + eps) * &a;
    let surrogate = unclipped.minimum(&clipped);
    let was_clipped = unclipped.gt_tensor(&clipped);
    (surrogate, was_clipped)
}

/// KL(p_cur ‖ p_ref) at each prefix over the whole vocabulary, from logits of
/// shape (prefixes, vocab), computed in blocks of `block` columns with the
/// full-vocabulary logsumexp normalizers (normalizing each block on its own
/// would change the divergence). Gradients flow into `current` only.
///
/// The blocks are one `split`, not one `narrow` each: the values are the same
/// views, but autograd gives each narrowed view's gradient back as a zero-filled
/// tensor of the whole width and adds them up (at a 151,936-token vocabulary, 38
/// full-size fills and sums per backward pass), where `split` concatenates the
/// blocks' gradients once.
pub fn exact_kl(current: &Tensor, reference: &Tensor, block: i64) -> Tensor {
    let lse_cur = current.logsumexp([-1], true);
    let lse_ref = reference.logsumexp([-1], true);
    let kind = current.kind();
    let mut total = Tensor::zeros(lse_cur.size()[..lse_cur.dim() - 1].to_vec(), (kind, current.device()));
    for (c, r) in current.split(block, -1).iter().zip(reference.split(block, -1)) {
        let lc = c - &lse_cur;
        let lr = r - &lse_ref;
        total = total + (lc.exp() * (&lc - lr)).sum_dim_intlist(-1, false, kind);
    }
    total
}

/// Mean over each response's tokens, then over the responses of each group,
/// then over groups. `values`, `mask`: (rows, tokens); rows are grouped in
/// order, `group_size` each. A long response gets no more weight than a short one.
pub fn reduce_tokens_responses_prompts(values: &Tensor, mask: &Tensor, group_size: i64) -> Tensor {
    let mask = mask.to_kind(values.kind());
    let per_response = (values * &mask).sum_dim_intlist(-1, false, values.kind())
        / mask.sum_dim_intlist(-1, false, values.kind()).clamp_min(1.0);
    per_response.view([-1, group_size]).mean_dim(-1, false, values.kind()).mean(values.kind())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// The protocol's vocabulary block.
    const KL_BLOCK: i64 = 4096;

    fn t(v: &[f64]) -> Tensor {
        Tensor::from_slice(v).to_kind(Kind::Double)
    }

    #[test]
    fn advantages_of_1010_are_close_to_but_not_exactly_plus_minus_one() {
        let a = group_advantages(&[1.0, 0.0, 1.0, 0.0]);
        // Population std is 0.5; the 1e-8 in the denominator keeps them off ±1.
        let expected = 0.5 / (0.5 + 1e-8);
        assert_eq!(a, vec![expected, -expected, expected, -expected]);
        assert!(a[0] < 1.0 && (1.0 - a[0]) < 1e-7);
    }

    #[test]
    fn constant_groups_get_exactly_zero_advantages() {
        assert_eq!(group_advantages(&[1.0; 4]), vec![0.0; 4]);
        assert_eq!(group_advantages(&[0.0; 8]), vec![0.0; 8]);
    }

    #[test]
    fn the_clipped_surrogate_on_both_signs_and_both_branches_with_gradients() {
        // ρ for each column: 1.5 (above 1+ε), 0.5 (below 1−ε), 1.1 (inside).
        let rho = [1.5f64, 0.5, 1.1];
        let old = t(&[0.0, 0.0, 0.0]).view([1, 3]);
        for a in [1.0f64, -1.0] {
            let logp = t(&rho.map(f64::ln)).view([1, 3]).set_requires_grad(true);
            let (s, clipped) = clipped_surrogate(&logp, &old, &t(&[a]), 0.2);
            let values = Vec::<f64>::try_from(&s.view([-1])).unwrap();
            let flags = Vec::<bool>::try_from(&clipped.view([-1])).unwrap();
            s.sum(Kind::Double).backward();
            let grad = Vec::<f64>::try_from(&logp.grad().view([-1])).unwrap();
            if a > 0.0 {
                // A > 0: ρ = 1.5 is capped at 1.2 (no gradient); ρ = 0.5 keeps its own value (pessimistic min).
                assert_eq!(values, vec![1.2, 0.5, 1.1]);
                assert_eq!(flags, vec![true, false, false]);
                // d(ρA)/dlogp = ρA on unclipped tokens; zero on the clipped side.
                assert_eq!(grad[0], 0.0);
                assert!((grad[1] - 0.5).abs() < 1e-12 && (grad[2] - 1.1).abs() < 1e-12);
            } else {
                // A < 0: ρ = 0.5 is floored at 0.8 (−0.8, no gradient); ρ = 1.5 keeps −1.5.
                assert_eq!(values, vec![-1.5, -0.8, -1.1]);
                assert_eq!(flags, vec![false, true, false]);
                assert_eq!(grad[1], 0.0);
                assert!((grad[0] + 1.5).abs() < 1e-12 && (grad[2] + 1.1).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn the_blocked_kl_equals_the_one_shot_kl_values_and_gradients() {
        tch::manual_seed(0);
        for kind in [Kind::Double, Kind::Float] {
            let cur = (Tensor::randn([5, 10_000], (kind, Device::Cpu)) * 2.0).set_requires_grad(true);
            let reference = Tensor::randn([5, 10_000], (kind, Device::Cpu)) * 2.0;
            let blocked = exact_kl(&cur, &reference, KL_BLOCK);
            let one_shot = (cur.log_softmax(-1, kind).exp()
                * (cur.log_softmax(-1, kind) - reference.log_softmax(-1, kind)))
            .sum_dim_intlist(-1, false, kind);
            let tol = if kind == Kind::Double { 1e-12 } else { 1e-5 };
            let diff = (&blocked - &one_shot).abs().max().double_value(&[]);
            assert!(diff < tol, "{kind:?}: {diff}");
            // An independent reference: libtorch's own kl_div (target = current, log-space).
            let by_torch = reference
                .log_softmax(-1, kind)
                .kl_div(&cur.log_softmax(-1, kind), tch::Reduction::None, true)
                .sum_dim_intlist(-1, false, kind);
            let diff = (&blocked - &by_torch).abs().max().double_value(&[]);
            assert!(diff < tol, "{kind:?} vs torch kl_div: {diff}");
            let g3 = tch::Tensor::run_backward(&[by_torch.sum(kind)], &[&cur], true, false).remove(0);
            let g1 = tch::Tensor::run_backward(&[blocked.sum(kind)], &[&cur], true, false).remove(0);
            let g2 = tch::Tensor::run_backward(&[one_shot.sum(kind)], &[&cur], true, false).remove(0);
            let gdiff = (&g1 - g2).abs().max().double_value(&[]);
            assert!(gdiff < tol, "{kind:?} gradients: {gdiff}");
            let gdiff = (g1 - g3).abs().max().double_value(&[]);
            assert!(gdiff < tol, "{kind:?} gradients vs torch kl_div: {gdiff}");
            // Normalizing each block on its own would give another number.
            let wrong = exact_kl(&cur.narrow(-1, 0, 4096), &reference.narrow(-1, 0, 4096), KL_BLOCK);
            assert!((wrong - blocked).abs().max().double_value(&[]) > 1e-3);
        }
    }

    /// The blocks as `narrow` views, as they were taken before `split`.
    fn exact_kl_by_narrow(current: &Tensor, reference: &Tensor, block: i64) -> Tensor {
        let v = current.size()[current.dim() - 1];
        let lse_cur = current.logsumexp([-1], true);
        let lse_ref = reference.logsumexp([-1], true);
        let kind = current.kind();
        let mut total = Tensor::zeros(lse_cur.size()[..lse_cur.dim() - 1].to_vec(), (kind, current.device()));
        let mut start = 0;
        while start < v {
            let width = block.min(v - start);
            let lc = current.narrow(-1, start, width) - &lse_cur;
            let lr = reference.narrow(-1, start, width) - &lse_ref;
            total = total + (lc.exp() * (&lc - lr)).sum_dim_intlist(-1, false, kind);
            start += width;
        }
        total
    }

    #[test]
    fn split_blocks_give_the_bits_of_narrowed_blocks_values_and_gradients() {
        tch::manual_seed(3);
        // A vocabulary that is not a multiple of the block (the last block is short),
        // one that is, and one narrower than a block.
        for (v, block) in [(10_000, KL_BLOCK), (8192, KL_BLOCK), (96, 32), (50, KL_BLOCK)] {
            let cur = (Tensor::randn([3, 4, v], (Kind::Float, Device::Cpu)) * 2.0).set_requires_grad(true);
            let reference = Tensor::randn([3, 4, v], (Kind::Float, Device::Cpu)) * 2.0;
            let weights = Tensor::randn([3, 4], (Kind::Float, Device::Cpu));
            let ours = exact_kl(&cur, &reference, block);
            let before = exact_kl_by_narrow(&cur, &reference, block);
            assert!(ours.equal(&before), "values, vocabulary {v}");
            let g1 = Tensor::run_backward(&[(&ours * &weights).sum(Kind::Float)], &[&cur], true, false).remove(0);
            let g2 = Tensor::run_backward(&[(&before * &weights).sum(Kind::Float)], &[&cur], true, false).remove(0);
            assert!(g1.equal(&g2), "gradients, vocabulary {v}");
        }
    }

    #[test]
    fn a_long_response_gets_no_more_weight_than_a_short_one() {
        // Two groups of two responses: lengths 1 and 3 tokens.
        let values = t(&[4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0, 0.0, 0.0, 2.0, 2.0, 2.0]).view([4, 3]);
        let mask = t(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0]).view([4, 3]);
        let r = reduce_tokens_responses_prompts(&values, &mask, 2).double_value(&[]);
        // Responses: 4, 1, 2, 2 → groups: 2.5, 2 → 2.25. A token-level mean would give 18/8.
        assert_eq!(r, 2.25);
    }
}
