//! StockArithmetic-v1: the task, its exact solver, its generator and its verifiers.
//!
//! A problem is an initial stock, two deliveries and two withdrawals; every
//! intermediate stock stays non-negative. Targets come from [`solve`], never
//! from a model. The protocol is `shared/seeds/003_…` ("La réponse doit
//! correspondre au calcul").

pub mod generate;
pub mod json_strict;
pub mod rng;
pub mod rows;
pub mod table;
pub mod verifier;

use serde::{Deserialize, Serialize};

/// Operands are integers in this range for every population.
pub const OPERAND_MAX: u32 = 100;

/// One StockArithmetic problem, as the verifier receives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Problem {
    pub initial: u32,
    pub deliveries: [u32; 2],
    pub withdrawals: [u32; 2],
}

/// Why a problem is not a valid StockArithmetic problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SolveError {
    #[error("operand {0} is outside 0..={OPERAND_MAX}")]
    OperandOutOfRange(u32),
    #[error("the stock would go negative after a withdrawal of {withdrawal} from {stock}")]
    NegativeStock { stock: u32, withdrawal: u32 },
}

/// The exact final stock: initial, plus both deliveries, minus both withdrawals
/// in order, refusing any intermediate negative stock.
pub fn solve(p: &Problem) -> Result<u32, SolveError> {
    for v in [p.initial].iter().chain(&p.deliveries).chain(&p.withdrawals) {
        if *v > OPERAND_MAX {
            return Err(SolveError::OperandOutOfRange(*v));
        }
    }
    let mut stock = p.initial + p.deliveries[0] + p.deliveries[1];
    for w in p.withdrawals {
        stock = stock.checked_sub(w).ok_or(SolveError::NegativeStock { stock, withdrawal: w })?;
    }
    Ok(stock)
}

/// The tuple problems are deduplicated on: a permutation of the same movements
/// is the same problem, so it can never sit in two splits.
pub fn normalized(p: &Problem) -> (u32, [u32; 2], [u32; 2]) {
    let mut d = p.deliveries;
    let mut w = p.withdrawals;
    d.sort_unstable();
    w.sort_unstable();
    (p.initial, d, w)
}

/// Which operand range a problem was drawn from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Population {
    /// Every operand in 0..=50.
    ID50,
    /// At least one operand in 51..=100 (test only).
    OOD100,
}

/// The dataset's splits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Validation,
    Test,
    /// An optional synthetic corpus for pretraining a tiny model, disjoint from
    /// every other split by construction (empty in the protocol).
    Pretrain,
    /// Optional arithmetic drills (running totals as bare arithmetic) for a
    /// tiny model's first pretraining stage, disjoint from every other split.
    Drills,
}

impl Split {
    pub const ALL: [Split; 5] = [Split::Train, Split::Validation, Split::Test, Split::Pretrain, Split::Drills];

    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Validation => "validation",
            Split::Test => "test",
            Split::Pretrain => "pretrain",
            Split::Drills => "drills",
        }
    }
}

impl Population {
    /// Whether a problem's operands fit this population.
    pub fn contains(self, p: &Problem) -> bool {
        let operands = [p.initial, p.deliveries[0], p.deliveries[1], p.withdrawals[0], p.withdrawals[1]];
        match self {
            Population::ID50 => operands.iter().all(|v| *v <= 50),
            Population::OOD100 => operands.iter().all(|v| *v <= 100) && operands.iter().any(|v| *v > 50),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_solver_handles_the_limits() {
        let p = Problem { initial: 0, deliveries: [0, 0], withdrawals: [0, 0] };
        assert_eq!(solve(&p), Ok(0));
        let p = Problem { initial: 100, deliveries: [100, 100], withdrawals: [0, 0] };
        assert_eq!(solve(&p), Ok(300));
        // The first withdrawal empties the stock exactly: allowed.
        let p = Problem { initial: 5, deliveries: [3, 2], withdrawals: [10, 0] };
        assert_eq!(solve(&p), Ok(0));
        let p = Problem { initial: 5, deliveries: [3, 2], withdrawals: [10, 1] };
        assert_eq!(solve(&p), Err(SolveError::NegativeStock { stock: 0, withdrawal: 1 }));
        let p = Problem { initial: 101, deliveries: [0, 0], withdrawals: [0, 0] };
        assert_eq!(solve(&p), Err(SolveError::OperandOutOfRange(101)));
    }

    proptest! {
        #[test]
        fn the_solver_equals_a_straightforward_recomputation(
            initial in 0u32..=100, d0 in 0u32..=100, d1 in 0u32..=100, w0 in 0u32..=100, w1 in 0u32..=100
        ) {
            let p = Problem { initial, deliveries: [d0, d1], withdrawals: [w0, w1] };
            let after_first = i64::from(initial) + i64::from(d0) + i64::from(d1) - i64::from(w0);
            let last = after_first - i64::from(w1);
            match solve(&p) {
                Ok(v) => {
                    prop_assert!(after_first >= 0 && last >= 0);
                    prop_assert_eq!(i64::from(v), last);
                }
                Err(_) => prop_assert!(after_first < 0 || last < 0),
            }
        }

        #[test]
        fn normalization_ignores_the_order_of_movements(
            initial in 0u32..=50, d0 in 0u32..=50, d1 in 0u32..=50, w0 in 0u32..=50, w1 in 0u32..=50
        ) {
            let a = Problem { initial, deliveries: [d0, d1], withdrawals: [w0, w1] };
            let b = Problem { initial, deliveries: [d1, d0], withdrawals: [w1, w0] };
            prop_assert_eq!(normalized(&a), normalized(&b));
        }
    }
}
