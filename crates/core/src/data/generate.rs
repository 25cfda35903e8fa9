//! The StockArithmetic-v1 generator: seeded, deterministic, deduplicated across
//! splits on the normalized tuple, targets from the exact solver.

use std::collections::HashSet;

use serde::Serialize;

use super::rng::Stream;
use super::{normalized, solve, Population, Problem, Split};

/// Counts of the protocol (shared/seeds/003: 1,000 / 200 / 200, 128 warm-start).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub train: usize,
    pub validation: usize,
    pub test_id50: usize,
    pub test_ood100: usize,
    pub warmstart: usize,
    /// Problems of the optional pretraining corpus (0 in the protocol).
    pub pretrain: usize,
    /// Problems of the optional arithmetic drills (0 in the protocol): each
    /// gives one drill per running total (see [`drills`]).
    pub drills: usize,
}

impl Default for Counts {
    fn default() -> Self {
        Counts {
            train: 1000,
            validation: 200,
            test_id50: 100,
            test_ood100: 100,
            warmstart: 128,
            pretrain: 0,
            drills: 0,
        }
    }
}

/// The instruction appended to every statement.
pub const FORMAT_INSTRUCTION: &str =
    "Reply with only a JSON object of the form {\"final_stock\": <integer>} and nothing else.";

/// Statement templates, shared by every split: this corpus does not represent
/// real inventories. Placeholders: {item}, {initial}, {d1}, {d2}, {w1}, {w2}.
pub const TEMPLATES: [&str; 8] = [
    "A warehouse holds {initial} {item}. Two deliveries arrive, one of {d1} and one of {d2}. Then {w1} {item} are shipped out, followed by {w2} more. How many {item} are in stock at the end?",
    "Inventory log for {item}: opening stock {initial}. Delivery: +{d1}. Delivery: +{d2}. Withdrawal: -{w1}. Withdrawal: -{w2}. What is the final stock?",
    "The shop starts the day with {initial} {item}. A supplier drops off {d1}, and later another {d2}. Customers take {w1}, and then {w2}. What is the stock of {item} at closing?",
    "Start: {initial} {item} on the shelf. Received {d1} {item}, then received {d2} {item}. Removed {w1} {item}, then removed {w2} {item}. Compute the final number of {item}.",
    "A depot counts {initial} {item}. Lot A brings {d1} and lot B brings {d2}. Orders then consume {w1} and {w2} {item}, in that order. What is the remaining stock?",
    "There are {initial} {item} in storage. After deliveries of {d1} and {d2}, two withdrawals of {w1} and {w2} happen one after the other. How many {item} remain?",
    "Stock movements for {item}. Initial quantity: {initial}. In: {d1}, {d2}. Out: {w1}, {w2} (in this order). Give the final quantity.",
    "The storeroom begins with {initial} {item}. It receives {d1} in the morning and {d2} at noon, then sends out {w1} in the afternoon and {w2} in the evening. What is the final stock?",
];

const ITEMS: [&str; 8] = ["boxes", "crates", "widgets", "pallets", "bolts", "lamps", "cables", "jars"];

/// One generated problem with everything every artifact needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Record {
    pub id: String,
    pub split: Split,
    pub population: Population,
    pub problem: Problem,
    pub target: u32,
    pub template: usize,
    pub statement: String,
    /// Among the first `warmstart` train problems.
    pub warmstart: bool,
    pub reference_response: String,
}

/// What a model may see of a problem: no structure, no target.
#[derive(Debug, Clone, Serialize)]
pub struct Page<'a> {
    pub id: &'a str,
    pub split: Split,
    pub population: Population,
    pub statement: &'a str,
}

/// What the verifier and the supervised trainer read.
#[derive(Debug, Clone, Serialize)]
pub struct Label<'a> {
    pub id: &'a str,
    pub split: Split,
    pub population: Population,
    pub problem: &'a Problem,
    pub target: u32,
    pub warmstart: bool,
    pub reference_response: &'a str,
    pub template: usize,
}

impl Record {
    pub fn page(&self) -> Page<'_> {
        Page { id: &self.id, split: self.split, population: self.population, statement: &self.statement }
    }
    pub fn label(&self) -> Label<'_> {
        Label {
            id: &self.id,
            split: self.split,
            population: self.population,
            problem: &self.problem,
            target: self.target,
            warmstart: self.warmstart,
            reference_response: &self.reference_response,
            template: self.template,
        }
    }
}

/// The template index of a drill (one past the statement templates).
pub const DRILL_TEMPLATE: usize = TEMPLATES.len();

/// A drill's statement: the movements as bare arithmetic, `31 + 12 + 5 - 20 - 7`,
/// up to `operands` of them (2 to 5: the running totals of one problem).
pub fn drill_statement(p: &Problem, operands: usize) -> String {
    let mut s = p.initial.to_string();
    let terms = [('+', p.deliveries[0]), ('+', p.deliveries[1]), ('-', p.withdrawals[0]), ('-', p.withdrawals[1])];
    for (sign, v) in terms.iter().take(operands - 1) {
        s.push_str(&format!(" {sign} {v}"));
    }
    s
}

/// The problem of a running total: the first `operands` movements, the rest 0.
fn prefix(p: &Problem, operands: usize) -> Problem {
    let keep = |i: usize, v: u32| if i < operands { v } else { 0 };
    Problem {
        initial: p.initial,
        deliveries: [keep(1, p.deliveries[0]), keep(2, p.deliveries[1])],
        withdrawals: [keep(3, p.withdrawals[0]), keep(4, p.withdrawals[1])],
    }
}

/// The arithmetic drills: for each of `wanted` fresh ID50 problems, its four
/// running totals as bare arithmetic (`a + b`, `a + b + c`, `a + b + c - d`,
/// `a + b + c - d - e`), each answered in the protocol's response format. A
/// problem is used only if none of its running totals (as a problem, the missing
/// movements 0) is already in `seen`, so the drills never contain a problem of
/// another split, even one whose last movements are 0; whole problems are
/// distinct, short running totals recur.
fn drills(
    rng: &mut Stream,
    wanted: usize,
    seen: &mut HashSet<(u32, [u32; 2], [u32; 2])>,
) -> Result<Vec<Record>, usize> {
    let problems = draw(rng, 50, wanted, |p| {
        let clash = (2..=5).any(|k| seen.contains(&normalized(&prefix(p, k))));
        // Only the whole problem is reserved: short running totals (`31 + 12`)
        // recur across drills, as there are only 51 × 51 of them.
        !clash && seen.insert(normalized(p))
    })?;
    let mut out = Vec::with_capacity(wanted * 4);
    for p in problems {
        for k in 2..=5 {
            let q = prefix(&p, k);
            let target = solve(&q).expect("a running total of a valid problem is valid");
            out.push(Record {
                id: String::new(),
                split: Split::Drills,
                population: Population::ID50,
                problem: q,
                target,
                template: DRILL_TEMPLATE,
                statement: drill_statement(&p, k),
                warmstart: false,
                reference_response: reference_response(target),
            });
        }
    }
    Ok(out)
}

/// The protocol's reference response for a target.
pub fn reference_response(target: u32) -> String {
    format!("{{\"final_stock\": {target}}}")
}

/// Renders a statement: the template, then the format instruction.
pub fn render(template: usize, item: &str, p: &Problem) -> String {
    let body = TEMPLATES[template]
        .replace("{item}", item)
        .replace("{initial}", &p.initial.to_string())
        .replace("{d1}", &p.deliveries[0].to_string())
        .replace("{d2}", &p.deliveries[1].to_string())
        .replace("{w1}", &p.withdrawals[0].to_string())
        .replace("{w2}", &p.withdrawals[1].to_string());
    format!("{body} {FORMAT_INSTRUCTION}")
}

/// The seed document's sampler: deliveries first, then withdrawals bounded by
/// what is available, so every intermediate stock is non-negative.
fn sample(rng: &mut Stream, maximum: u32) -> Problem {
    let initial = rng.int_inclusive(0, maximum);
    let deliveries = [rng.int_inclusive(0, maximum), rng.int_inclusive(0, maximum)];
    let available = initial + deliveries[0] + deliveries[1];
    let first = rng.int_inclusive(0, maximum.min(available));
    let second = rng.int_inclusive(0, maximum.min(available - first));
    Problem { initial, deliveries, withdrawals: [first, second] }
}

/// Draws `wanted` problems of a population not yet in `seen`; `Err(got)` when
/// 100,000 draws in a row were rejected (the space is exhausted).
fn draw_distinct(
    rng: &mut Stream,
    population: Population,
    maximum: u32,
    wanted: usize,
    seen: &mut HashSet<(u32, [u32; 2], [u32; 2])>,
) -> Result<Vec<Problem>, usize> {
    draw(rng, maximum, wanted, |p| population.contains(p) && seen.insert(normalized(p)))
}

/// Draws `wanted` problems with operands in 0..=`maximum` that `accept` takes
/// (it records what it takes); `Err(got)` when 100,000 draws in a row were refused.
fn draw(
    rng: &mut Stream,
    maximum: u32,
    wanted: usize,
    mut accept: impl FnMut(&Problem) -> bool,
) -> Result<Vec<Problem>, usize> {
    let mut out = Vec::with_capacity(wanted);
    let mut rejected_in_a_row = 0;
    while out.len() < wanted {
        let p = sample(rng, maximum);
        if accept(&p) {
            out.push(p);
            rejected_in_a_row = 0;
        } else {
            rejected_in_a_row += 1;
            if rejected_in_a_row >= 100_000 {
                return Err(out.len());
            }
        }
    }
    Ok(out)
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("could not draw {wanted} distinct {population:?} problems for {split} (got {got}); the operand space is too small for these counts")]
pub struct GenerateError {
    pub split: &'static str,
    pub population: Population,
    pub wanted: usize,
    pub got: usize,
}

/// Generates the whole dataset. Test problems are drawn first, so the test
/// set does not depend on the train and validation counts.
pub fn generate(seed: u64, counts: &Counts) -> Result<Vec<Record>, GenerateError> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(counts.train + counts.validation + counts.test_id50 + counts.test_ood100);
    let plan = [
        (Split::Test, Population::OOD100, counts.test_ood100),
        (Split::Test, Population::ID50, counts.test_id50),
        (Split::Validation, Population::ID50, counts.validation),
        (Split::Train, Population::ID50, counts.train),
        // Last, so adding a corpus never changes the protocol's splits.
        (Split::Pretrain, Population::ID50, counts.pretrain),
    ];
    let mut test_rows = Vec::new();
    for (split, population, wanted) in plan {
        let mut rng = Stream::new(seed, &format!("stock_arithmetic/v1/problems/{}/{population:?}", split.as_str()));
        let mut style = Stream::new(seed, &format!("stock_arithmetic/v1/style/{}/{population:?}", split.as_str()));
        let maximum = if population == Population::OOD100 { 100 } else { 50 };
        let problems = draw_distinct(&mut rng, population, maximum, wanted, &mut seen)
            .map_err(|got| GenerateError { split: split.as_str(), population, wanted, got })?;
        let mut rows = Vec::with_capacity(wanted);
        for p in problems {
            let target = solve(&p).expect("the sampler keeps stocks non-negative and operands in range");
            let template = style.int_inclusive(0, TEMPLATES.len() as u32 - 1) as usize;
            let item = ITEMS[style.int_inclusive(0, ITEMS.len() as u32 - 1) as usize];
            rows.push((p, target, template, render(template, item, &p)));
        }
        let rows: Vec<Record> = rows
            .into_iter()
            .map(|(problem, target, template, statement)| Record {
                id: String::new(),
                split,
                population,
                problem,
                target,
                template,
                statement,
                warmstart: false,
                reference_response: reference_response(target),
            })
            .collect();
        if split == Split::Test {
            test_rows.extend(rows);
        } else {
            out.extend(rows);
        }
    }
    // Drills last of all, so they never change another split.
    let mut rng = Stream::new(seed, "stock_arithmetic/v1/problems/drills/ID50");
    out.extend(drills(&mut rng, counts.drills, &mut seen).map_err(|got| GenerateError {
        split: Split::Drills.as_str(),
        population: Population::ID50,
        wanted: counts.drills,
        got,
    })?);
    // Test: ID50 first, then OOD100, numbered together.
    test_rows.sort_by_key(|r| r.population);
    out.extend(test_rows);
    let mut next = std::collections::BTreeMap::<Split, usize>::new();
    for r in out.iter_mut() {
        let n = next.entry(r.split).or_default();
        r.id = format!("{}-{:04}", r.split.as_str(), *n);
        r.warmstart = r.split == Split::Train && *n < counts.warmstart;
        *n += 1;
    }
    // Stable: within a split, the numbering order (ids past 9999 get a fifth digit).
    out.sort_by_key(|r| r.split);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn small() -> Counts {
        Counts { train: 60, validation: 20, test_id50: 10, test_ood100: 10, warmstart: 16, pretrain: 0, drills: 0 }
    }

    #[test]
    fn protocol_counts_are_exact() {
        let rows = generate(0, &Counts::default()).unwrap();
        let count = |s: Split, p: Option<Population>| {
            rows.iter().filter(|r| r.split == s && p.is_none_or(|p| r.population == p)).count()
        };
        assert_eq!(rows.len(), 1400);
        assert_eq!(count(Split::Train, None), 1000);
        assert_eq!(count(Split::Validation, None), 200);
        assert_eq!(count(Split::Test, Some(Population::ID50)), 100);
        assert_eq!(count(Split::Test, Some(Population::OOD100)), 100);
        let warm: Vec<&Record> = rows.iter().filter(|r| r.warmstart).collect();
        assert_eq!(warm.len(), 128);
        assert!(warm.iter().all(|r| r.split == Split::Train));
        assert_eq!(warm.last().unwrap().id, "train-0127");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]

        #[test]
        fn every_problem_is_valid_for_its_population_and_splits_are_disjoint(seed in any::<u64>()) {
            let rows = generate(seed, &small()).unwrap();
            let mut seen = HashSet::new();
            for r in &rows {
                prop_assert!(r.population.contains(&r.problem), "{:?}", r);
                prop_assert_eq!(solve(&r.problem).ok(), Some(r.target));
                prop_assert!(seen.insert(normalized(&r.problem)), "duplicate across splits: {:?}", r);
                prop_assert_eq!(&r.reference_response, &reference_response(r.target));
                prop_assert!(r.statement.contains(FORMAT_INSTRUCTION));
                if r.split != Split::Test {
                    prop_assert_eq!(r.population, Population::ID50);
                }
            }
            prop_assert_eq!(rows.len(), 100);
        }

        #[test]
        fn same_seed_same_bytes_different_seed_different_data(seed in any::<u64>()) {
            let a = serde_json::to_string(&generate(seed, &small()).unwrap()).unwrap();
            let b = serde_json::to_string(&generate(seed, &small()).unwrap()).unwrap();
            let c = serde_json::to_string(&generate(seed.wrapping_add(1), &small()).unwrap()).unwrap();
            prop_assert_eq!(&a, &b);
            prop_assert_ne!(a, c);
        }
    }

    #[test]
    fn a_pretraining_corpus_is_disjoint_and_leaves_the_protocol_splits_unchanged() {
        let without = generate(3, &small()).unwrap();
        let with = generate(3, &Counts { pretrain: 200, ..small() }).unwrap();
        let protocol: Vec<&Record> = with.iter().filter(|r| r.split != Split::Pretrain).collect();
        assert_eq!(protocol, without.iter().collect::<Vec<_>>());
        let corpus: Vec<&Record> = with.iter().filter(|r| r.split == Split::Pretrain).collect();
        assert_eq!(corpus.len(), 200);
        let seen: HashSet<_> = without.iter().map(|r| normalized(&r.problem)).collect();
        assert!(corpus.iter().all(|r| !seen.contains(&normalized(&r.problem))));
    }

    #[test]
    fn drills_are_running_totals_disjoint_from_every_split_and_change_nothing_else() {
        let without = generate(5, &Counts { pretrain: 100, ..small() }).unwrap();
        let with = generate(5, &Counts { pretrain: 100, drills: 2600, ..small() }).unwrap();
        let others: Vec<&Record> = with.iter().filter(|r| r.split != Split::Drills).collect();
        assert_eq!(others, without.iter().collect::<Vec<_>>());
        let drills: Vec<&Record> = with.iter().filter(|r| r.split == Split::Drills).collect();
        assert_eq!(drills.len(), 10_400);
        let seen: HashSet<_> = without.iter().map(|r| normalized(&r.problem)).collect();
        for (i, group) in drills.chunks(4).enumerate() {
            // One problem's four running totals, 2 to 5 operands, each computed
            // here from its statement's own numbers.
            for (k, r) in group.iter().enumerate() {
                assert!(!seen.contains(&normalized(&r.problem)), "drill {i} is a problem of another split: {r:?}");
                let words: Vec<&str> = r.statement.split(' ').collect();
                assert_eq!(words.len(), 2 * (k + 2) - 1, "{}", r.statement);
                let mut total: i64 = words[0].parse().unwrap();
                for pair in words[1..].chunks(2) {
                    let v: i64 = pair[1].parse().unwrap();
                    total += if pair[0] == "+" { v } else { -v };
                    assert!(total >= 0, "a running total is never negative: {}", r.statement);
                }
                assert_eq!(total, r.target as i64, "{}", r.statement);
                assert_eq!(r.reference_response, reference_response(r.target));
                assert_eq!(r.template, DRILL_TEMPLATE);
                assert!(r.population.contains(&r.problem));
            }
            assert!(group[3].statement.starts_with(&group[2].statement), "{:?}", group);
        }
        let ids: HashSet<&str> = drills.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids.len(), 10_400);
    }

    #[test]
    fn an_exhausted_space_is_an_error_not_a_hang() {
        // With operands in 0..=1 there are only a handful of distinct problems.
        let mut rng = Stream::new(0, "exhaust");
        let got = draw_distinct(&mut rng, Population::ID50, 1, 1000, &mut HashSet::new()).unwrap_err();
        assert!(got > 0 && got < 50, "{got}");
    }
}
