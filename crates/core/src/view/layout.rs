//! Where each node of a DAG drawing goes: ranks by longest path, dummy
//! vertices for long edges, and crossings reduced as Graphviz's `dot` does.

use std::collections::BTreeMap;

use super::NodeView;

/// Where each node of a DAG drawing goes. Vertices are the nodes (`0..real`)
/// and, as in Graphviz's `dot`, one dummy vertex per rank an edge passes over,
/// so a long edge is routed between the boxes instead of through them.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// Each vertex's rank, top to bottom (a node's: the longest path from a source).
    pub rank: Vec<usize>,
    /// Vertices per rank, left to right.
    pub layers: Vec<Vec<usize>>,
    /// How many vertices are nodes.
    pub real: usize,
    /// Each edge as the vertices it passes: `[parent, dummies..., child]`.
    pub chains: Vec<Vec<usize>>,
}

impl Layout {
    /// A vertex's place within its rank, centred on the rank's middle.
    fn x(&self, i: usize) -> f64 {
        let layer = &self.layers[self.rank[i]];
        let at = layer.iter().position(|&j| j == i).unwrap_or(0);
        at as f64 - (layer.len() as f64 - 1.0) / 2.0
    }

    /// Pairs of segments (between adjacent ranks) that cross.
    pub fn crossings(&self) -> usize {
        let segments: Vec<(usize, f64, f64)> = self
            .chains
            .iter()
            .flat_map(|c| c.windows(2).map(|w| (self.rank[w[0]], self.x(w[0]), self.x(w[1]))))
            .collect();
        let mut n = 0;
        for (i, a) in segments.iter().enumerate() {
            for b in &segments[i + 1..] {
                if a.0 == b.0 && (a.1 - b.1) * (a.2 - b.2) < 0.0 {
                    n += 1;
                }
            }
        }
        n
    }
}

/// The edges (parent, child) of nodes listed with their deps by id.
pub fn edges(nodes: &[NodeView]) -> Vec<(usize, usize)> {
    let pos: BTreeMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.id.as_str(), i)).collect();
    let mut out = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        for d in &n.deps {
            if let Some(&j) = pos.get(d.as_str()) {
                if j != i {
                    out.push((j, i));
                }
            }
        }
    }
    out
}

/// Ranks and dummy vertices, each rank in listing order: the layout before
/// any crossing is reduced.
pub fn listed(nodes: &[NodeView]) -> Layout {
    let edges = edges(nodes);
    let mut rank = vec![0usize; nodes.len()];
    // Longest path from a source; a pass per node suffices for a DAG listed in any order.
    for _ in 0..nodes.len() {
        let mut changed = false;
        for &(u, v) in &edges {
            if rank[v] < rank[u] + 1 && rank[u] < nodes.len() {
                rank[v] = rank[u] + 1;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut chains = Vec::with_capacity(edges.len());
    for &(u, v) in &edges {
        let mut chain = vec![u];
        for r in rank[u] + 1..rank[v] {
            rank.push(r);
            chain.push(rank.len() - 1);
        }
        chain.push(v);
        chains.push(chain);
    }
    let ranks = rank.iter().max().map_or(0, |r| r + 1);
    let mut layers: Vec<Vec<usize>> = vec![Vec::new(); ranks];
    for (i, &r) in rank.iter().enumerate() {
        layers[r].push(i);
    }
    Layout { rank, layers, real: nodes.len(), chains }
}

/// A layered drawing as Graphviz's `dot` makes one (Sugiyama's method, simply):
/// [`listed`], then sweeps down and up that order each rank by the mean place
/// of its neighbours in the rank above (below), the barycentre heuristic,
/// keeping the order with the fewest crossings.
pub fn layered(nodes: &[NodeView]) -> Layout {
    let mut layout = listed(nodes);
    let segments: Vec<(usize, usize)> = layout.chains.iter().flat_map(|c| c.windows(2).map(|w| (w[0], w[1]))).collect();
    let ranks = layout.layers.len();
    let mut best = (layout.crossings(), layout.layers.clone());
    for sweep in 0..12 {
        let down = sweep % 2 == 0;
        let order: Vec<usize> = if down { (1..ranks).collect() } else { (0..ranks.saturating_sub(1)).rev().collect() };
        for r in order {
            let centre = (layout.layers[r].len() as f64 - 1.0) / 2.0;
            let mut keyed: Vec<(f64, usize, usize)> = layout.layers[r]
                .iter()
                .enumerate()
                .map(|(at, &i)| {
                    let near: Vec<f64> = segments
                        .iter()
                        .filter_map(|&(u, v)| match (down, u == i, v == i) {
                            (true, _, true) => Some(layout.x(u)),
                            (false, true, _) => Some(layout.x(v)),
                            _ => None,
                        })
                        .collect();
                    let key =
                        if near.is_empty() { at as f64 - centre } else { near.iter().sum::<f64>() / near.len() as f64 };
                    (key, at, i)
                })
                .collect();
            keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            layout.layers[r] = keyed.into_iter().map(|(_, _, i)| i).collect();
        }
        let c = layout.crossings();
        if c < best.0 {
            best = (c, layout.layers.clone());
        }
    }
    layout.layers = best.1;
    layout
}

#[cfg(test)]
mod tests {
    use super::super::test_node;
    use super::*;

    fn dag(edges: &[(&str, &[&str])]) -> Vec<NodeView> {
        edges
            .iter()
            .map(|(id, deps)| NodeView {
                deps: deps.iter().map(|d| d.to_string()).collect(),
                ..test_node(id, "shell", &[])
            })
            .collect()
    }

    #[test]
    fn the_layered_layout_ranks_by_longest_path_and_uncrosses_what_listing_order_crosses() {
        // Listed in this order, p (child of y) sits left of q (child of x): the
        // edges cross; x → z passes rank 1 through a dummy vertex.
        let nodes = dag(&[("x", &[]), ("y", &[]), ("p", &["y"]), ("q", &["x"]), ("z", &["p", "x"])]);
        let naive = listed(&nodes);
        assert_eq!(&naive.rank[..5], [0, 0, 1, 1, 2], "z is below p, which is below y");
        assert_eq!(naive.rank.len(), 6, "one dummy, for x → z at rank 1");
        assert!(naive.crossings() >= 1);
        let l = layered(&nodes);
        assert_eq!(l.crossings(), 0, "{l:?}");
        assert!(l.chains.iter().all(|c| c.windows(2).all(|w| l.rank[w[0]] + 1 == l.rank[w[1]])), "{l:?}");
    }

    /// The committed pack's DAG (read from the pack, as its report reads it).
    #[test]
    fn the_committed_packs_dag_is_drawn_in_ranks_with_fewer_crossings_than_listed() {
        let pack = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../artifacts/grpo-main-tiny/v0.2.0");
        let src = super::super::RunView::from_pack(&pack).unwrap();
        let (l, naive) = (layered(&src.nodes), listed(&src.nodes));
        assert!(l.chains.iter().all(|c| c.windows(2).all(|w| l.rank[w[0]] + 1 == l.rank[w[1]])));
        assert!(l.crossings() < naive.crossings(), "{} vs {}", l.crossings(), naive.crossings());
        // More than one rank: not every node in one row.
        assert!(l.layers.len() >= 6, "{:?}", l.layers);
        eprintln!("crossings: listed {}, layered {}", naive.crossings(), l.crossings());
    }
}
