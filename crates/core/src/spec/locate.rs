//! Maps a path inside a YAML document (`nodes.train.params.lr`) to the line and
//! column where it was written, so every spec error can point at the source.
//!
//! serde's YAML deserializer keeps no positions once a value is built, so the
//! document is read a second time with yaml-rust2's event parser, which does.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// A position in a source file: 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

impl From<Marker> for Pos {
    fn from(m: Marker) -> Self {
        // yaml-rust2 lines are 1-based, columns 0-based.
        Pos { line: m.line(), col: m.col() + 1 }
    }
}

/// Where each path of a document was written: the key's position (for mapping
/// entries) and the value's position.
///
/// Built lazily: the second parse happens the first time a position is
/// asked for, i.e. when a spec has an error to point at. A valid spec is
/// parsed once (it was parsed twice on every load: 200 nodes' `validate`
/// spent a fifth of its time here).
#[derive(Debug, Default, Clone)]
pub struct Locator {
    source: std::sync::Arc<str>,
    located: std::sync::Arc<std::sync::OnceLock<Located>>,
}

#[derive(Debug, Default)]
struct Located {
    keys: HashMap<Vec<String>, Pos>,
    values: HashMap<Vec<String>, Pos>,
    /// Keys written twice in one mapping: (path, first, second).
    duplicates: Vec<(Vec<String>, Pos, Pos)>,
}

#[derive(Default)]
struct Collect(Vec<(Event, Marker)>);

impl MarkedEventReceiver for Collect {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        self.0.push((ev, mark));
    }
}

/// How deep a spec's collections may nest. Real specs nest about 6 levels;
/// YAML parsers recurse per level, and past a few thousand levels they take
/// minutes (100,000 `[` took 56 s), so this is checked first.
pub const MAX_DEPTH: usize = 64;

/// Where a document first nests flow collections (`[`, `{`) deeper than
/// [`MAX_DEPTH`], or `None`: one pass over the text, outside quoted scalars
/// and comments. (A YAML scanner must look ahead over a whole flow
/// collection for possible keys, quadratic in its depth, so this cannot be
/// left to the parser.) Block nesting is bounded by indentation, and the
/// parsers stop it at their recursion limit quickly.
pub fn too_deep(source: &str) -> Option<Pos> {
    let (mut line, mut col) = (1usize, 0usize);
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut comment = false;
    let mut prev = '\n';
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        col += 1;
        if c == '\n' {
            line += 1;
            col = 0;
            comment = false;
            // A plain scalar cannot hold a quote across lines, but a quoted one can.
            prev = c;
            continue;
        }
        if comment {
            continue;
        }
        match quote {
            Some('"') if c == '\\' => {
                chars.next();
                col += 1;
            }
            Some('\'') if c == '\'' && chars.peek() == Some(&'\'') => {
                chars.next();
                col += 1;
            }
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None => match c {
                '#' if prev.is_whitespace() => comment = true,
                '"' | '\'' if prev.is_whitespace() || matches!(prev, '[' | '{' | ',' | ':') => quote = Some(c),
                '[' | '{' => {
                    depth += 1;
                    if depth > MAX_DEPTH {
                        return Some(Pos { line, col });
                    }
                }
                ']' | '}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
        prev = c;
    }
    None
}

impl Locator {
    /// The locator of `source`, parsed when first asked.
    pub fn new(source: &str) -> Self {
        Locator { source: source.into(), located: Default::default() }
    }

    fn located(&self) -> &Located {
        self.located.get_or_init(|| Located::new(&self.source))
    }

    /// The key's position if the path ends in a mapping key, else the value's.
    pub fn key(&self, path: &[String]) -> Option<Pos> {
        let l = self.located();
        l.keys.get(path).or_else(|| l.values.get(path)).copied()
    }

    /// The value's position.
    pub fn value(&self, path: &[String]) -> Option<Pos> {
        let l = self.located();
        l.values.get(path).or_else(|| l.keys.get(path)).copied()
    }

    /// The first key written twice in one mapping: its path, first and second position.
    pub fn first_duplicate(&self) -> Option<&(Vec<String>, Pos, Pos)> {
        self.located().duplicates.first()
    }

    /// Whether the document wrote this exact path.
    pub fn has(&self, path: &[String]) -> bool {
        self.located().values.contains_key(path)
    }
}

impl Located {
    /// A document the parser rejects yields an empty one (serde reports the
    /// syntax error itself, with its own position).
    fn new(source: &str) -> Self {
        let mut events = Collect::default();
        let mut parser = Parser::new_from_str(source);
        if parser.load(&mut events, false).is_err() {
            return Located::default();
        }
        let mut loc = Located::default();
        let mut i = 0;
        let evs = &events.0;
        // Skip to the first document's root node.
        while i < evs.len()
            && !matches!(evs[i].0, Event::MappingStart(..) | Event::SequenceStart(..) | Event::Scalar(..))
        {
            i += 1;
        }
        if i < evs.len() {
            loc.walk(evs, &mut i, &mut Vec::new());
        }
        loc
    }

    fn walk(&mut self, evs: &[(Event, Marker)], i: &mut usize, path: &mut Vec<String>) {
        let Some((ev, mark)) = evs.get(*i) else {
            return;
        };
        self.values.entry(path.clone()).or_insert_with(|| (*mark).into());
        *i += 1;
        match ev {
            Event::MappingStart(..) => loop {
                match evs.get(*i) {
                    None => return,
                    Some((Event::MappingEnd, _)) => {
                        *i += 1;
                        return;
                    }
                    Some((Event::Scalar(key, ..), kmark)) => {
                        path.push(key.clone());
                        let pos: Pos = (*kmark).into();
                        if let Some(first) = self.keys.get(path.as_slice()) {
                            self.duplicates.push((path.clone(), *first, pos));
                        } else {
                            self.keys.insert(path.clone(), pos);
                        }
                        *i += 1;
                        self.walk(evs, i, path);
                        path.pop();
                    }
                    Some(_) => {
                        // A complex key: skip it and its value without recording.
                        let mut scratch = Vec::new();
                        self.walk(evs, i, &mut scratch);
                        self.walk(evs, i, &mut scratch);
                    }
                }
            },
            Event::SequenceStart(..) => {
                let mut index = 0usize;
                loop {
                    match evs.get(*i) {
                        None => return,
                        Some((Event::SequenceEnd, _)) => {
                            *i += 1;
                            return;
                        }
                        Some(_) => {
                            path.push(index.to_string());
                            self.walk(evs, i, path);
                            path.pop();
                            index += 1;
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_flow_nesting_is_found_in_one_pass_and_quotes_and_comments_do_not_count() {
        let deep = format!("name: x\nnodes: {}", "[".repeat(100_000));
        let t = std::time::Instant::now();
        assert_eq!(too_deep(&deep), Some(Pos { line: 2, col: 8 + MAX_DEPTH }));
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        let shallow = format!(
            "a: '{}'\nb: \"{}\" # {}\nc: [[1], {{d: [2]}}]\n",
            "[".repeat(500),
            "{".repeat(500),
            "[".repeat(500)
        );
        assert_eq!(too_deep(&shallow), None);
        assert_eq!(too_deep("a: 'it''s [' \nb: [x]"), None);
    }

    fn p(s: &str) -> Vec<String> {
        s.split('.').map(str::to_string).collect()
    }

    #[test]
    fn keys_and_values_point_at_where_they_were_written() {
        let src = "name: x\nnodes:\n  a:\n    op: shell\n    params:\n      outs: [o1, o2]\n";
        let loc = Locator::new(src);
        assert_eq!(loc.key(&p("nodes.a.op")), Some(Pos { line: 4, col: 5 }));
        assert_eq!(loc.value(&p("nodes.a.op")), Some(Pos { line: 4, col: 9 }));
        assert_eq!(loc.value(&p("nodes.a.params.outs.1")), Some(Pos { line: 6, col: 18 }));
        assert!(!loc.has(&p("nodes.b")));
    }

    #[test]
    fn a_broken_document_gives_an_empty_locator_not_a_panic() {
        let loc = Locator::new("a: [1, 2\nb: {");
        assert!(!loc.has(&p("a")));
    }
}

#[cfg(test)]
mod duplicate_tests {
    use super::*;

    #[test]
    fn a_key_written_twice_is_recorded_with_both_positions() {
        let loc = Locator::new("nodes:\n  a: 1\n  b: 2\n  a: 3\n");
        let (path, first, second) = loc.first_duplicate().expect("duplicate found");
        assert_eq!(path, &vec!["nodes".to_string(), "a".to_string()]);
        assert_eq!((first.line, second.line), (2, 4));
    }
}
