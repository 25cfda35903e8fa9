//! `dataset.stock_arithmetic`: generates StockArithmetic-v1 as separate artifacts
//! per split, pages (what a model may see) apart from labels (problems, targets).

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Op, OpError, OutputDecl, ParamError, RunContext, Taint};
use crate::data::generate::{generate, Counts, TEMPLATES};
use crate::data::{Population, Split};

/// Params of `dataset.stock_arithmetic`. The defaults are the protocol's counts.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DatasetParams {
    /// Seed of the generator: same seed, same bytes.
    #[serde(default)]
    pub seed: u64,
    #[serde(default = "d_train")]
    #[schemars(range(min = 1))]
    pub train: usize,
    #[serde(default = "d_validation")]
    #[schemars(range(min = 1))]
    pub validation: usize,
    /// Test problems with every operand in 0..=50.
    #[serde(default = "d_test")]
    #[schemars(range(min = 1))]
    pub test_id50: usize,
    /// Test problems with at least one operand in 51..=100.
    #[serde(default = "d_test")]
    #[schemars(range(min = 1))]
    pub test_ood100: usize,
    /// The first N train problems form the warm-start set.
    #[serde(default = "d_warmstart")]
    pub warmstart: usize,
    /// Problems of an optional pretraining corpus (`pages.pretrain`, `labels.pretrain`),
    /// drawn after every other split and disjoint from all of them. 0 in the protocol;
    /// the tiny profile uses one so its GRPO groups carry signal.
    #[serde(default)]
    pub pretrain: usize,
    /// Problems of optional arithmetic drills (`pages.drills`, `labels.drills`):
    /// each gives its four running totals as bare arithmetic (`31 + 12`, …,
    /// `31 + 12 + 5 - 20 - 7`) with the protocol's response, a first pretraining
    /// stage for a tiny model. Drawn last and disjoint from every split, running
    /// totals included. 0 in the protocol.
    #[serde(default)]
    pub drills: usize,
}

fn d_train() -> usize {
    Counts::default().train
}
fn d_validation() -> usize {
    Counts::default().validation
}
fn d_test() -> usize {
    Counts::default().test_id50
}
fn d_warmstart() -> usize {
    Counts::default().warmstart
}

impl DatasetParams {
    fn counts(&self) -> Counts {
        Counts {
            train: self.train,
            validation: self.validation,
            test_id50: self.test_id50,
            test_ood100: self.test_ood100,
            warmstart: self.warmstart,
            pretrain: self.pretrain,
            drills: self.drills,
        }
    }
}

pub struct StockArithmeticDataset;

/// Output names: `pages.<split>` and `labels.<split>` (JSON lines), and `summary`.
pub fn pages_output(split: Split) -> String {
    format!("pages.{}", split.as_str())
}
pub fn labels_output(split: Split) -> String {
    format!("labels.{}", split.as_str())
}

impl Op for StockArithmeticDataset {
    fn name(&self) -> &'static str {
        "dataset.stock_arithmetic"
    }
    fn version(&self) -> u32 {
        // 2: the optional pretraining corpus (two more outputs).
        // 3: the optional drills (two more outputs).
        3
    }
    fn summary(&self) -> &'static str {
        "StockArithmetic-v1: 1,000/200/200 problems, pages and labels per split"
    }
    type Params = DatasetParams;
    fn check(&self, p: &Self::Params) -> Result<(), ParamError> {
        if p.warmstart > p.train {
            return Err(ParamError {
                path: vec!["warmstart".into()],
                message: format!("warmstart ({}) cannot exceed train ({})", p.warmstart, p.train),
                unknown_key: false,
            });
        }
        Ok(())
    }
    fn inputs(&self, _params: &Self::Params) -> Option<Vec<super::InputDecl>> {
        Some(Vec::new())
    }
    fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
        split_outputs(&Split::ALL)
    }
    fn run(&self, p: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        let counts = p.counts();
        let records = generate(p.seed, &counts).map_err(|e| OpError::Failed(e.to_string()))?;
        for split in Split::ALL {
            let rows: Vec<_> = records.iter().filter(|r| r.split == split).collect();
            let mut pages = Vec::new();
            let mut labels = Vec::new();
            for r in &rows {
                serde_json::to_writer(&mut pages, &r.page()).map_err(|e| OpError::Failed(e.to_string()))?;
                pages.push(b'\n');
                serde_json::to_writer(&mut labels, &r.label()).map_err(|e| OpError::Failed(e.to_string()))?;
                labels.push(b'\n');
            }
            write(ctx, &pages_output(split), &pages)?;
            write(ctx, &labels_output(split), &labels)?;
        }
        let count = |s: Split, pop: Population| records.iter().filter(|r| r.split == s && r.population == pop).count();
        let summary = serde_json::json!({
            "dataset": "StockArithmetic-v1",
            "seed": p.seed,
            "protocol_counts": counts == Counts::default(),
            "counts": {
                "train": count(Split::Train, Population::ID50),
                "warmstart": records.iter().filter(|r| r.warmstart).count(),
                "validation": count(Split::Validation, Population::ID50),
                "pretrain": count(Split::Pretrain, Population::ID50),
                "drills": count(Split::Drills, Population::ID50),
                "test": {"ID50": count(Split::Test, Population::ID50), "OOD100": count(Split::Test, Population::OOD100)},
            },
            "templates": TEMPLATES.len(),
            "templates_shared_across_splits": true,
            "note": "statements are synthetic and share templates across splits; they do not represent real inventories",
        });
        let mut text = serde_json::to_vec_pretty(&summary).map_err(|e| OpError::Failed(e.to_string()))?;
        text.push(b'\n');
        write(ctx, "summary", &text)
    }
}

/// Each split's pages and labels, with its taint (and what the node read:
/// a file another node wrote keeps what it derives from), and `summary`.
pub(super) fn split_outputs(splits: &[Split]) -> Vec<OutputDecl> {
    let mut out = Vec::new();
    for split in splits {
        out.push(OutputDecl {
            taint: Some(BTreeSet::from([Taint::Pages(*split)])),
            inherits: true,
            ..OutputDecl::file(pages_output(*split))
        });
        out.push(OutputDecl {
            taint: Some(BTreeSet::from([Taint::Labels(*split)])),
            inherits: true,
            ..OutputDecl::file(labels_output(*split))
        });
    }
    out.push(OutputDecl { taint: Some(BTreeSet::new()), ..OutputDecl::file("summary") });
    out
}

/// Writes a store-only output of a dataset op.
pub(super) fn write(ctx: &RunContext<'_>, name: &str, bytes: &[u8]) -> Result<(), OpError> {
    ctx.write_output(name, bytes)
}
