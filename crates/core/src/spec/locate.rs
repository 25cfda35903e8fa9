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
    // Byte by byte, stopping only at the bytes that matter (a newline, `#`,
    // a quote, a bracket, a backslash): all ASCII, and no byte of a longer
    // UTF-8 character is one. The character before one that matters is
    // looked back at (decoded only past ASCII), and the column counted in
    // characters once something is found.
    const MATTERS: [bool; 256] = {
        let mut t = [false; 256];
        let marks = b"\n#\"'[]{}\\";
        let mut k = 0;
        while k < marks.len() {
            t[marks[k] as usize] = true;
            k += 1;
        }
        t
    };
    let bytes = source.as_bytes();
    // Whether the character before byte `at` is whitespace (a newline
    // before the first), and that character when it is ASCII.
    let before = |at: usize| -> (bool, u8) {
        match at.checked_sub(1).map(|k| bytes[k]) {
            None => (true, b'\n'),
            Some(b) if b < 0x80 => (b.is_ascii_whitespace() || b == 0x0b, b),
            Some(_) => (source[..at].chars().next_back().is_some_and(char::is_whitespace), 0x80),
        }
    };
    let (mut line, mut line_start) = (1usize, 0usize);
    let mut depth = 0usize;
    let mut quote: Option<u8> = None;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if !MATTERS[b as usize] {
            i += 1;
            continue;
        }
        if b == b'\n' {
            line += 1;
            line_start = i + 1;
            i += 1;
            continue;
        }
        match quote {
            // The escaped character is skipped whole, a newline too.
            Some(b'"') if b == b'\\' => {
                i += 1;
                if let Some(c) = source.get(i..).and_then(|rest| rest.chars().next()) {
                    i += c.len_utf8();
                }
                continue;
            }
            Some(b'\'') if b == b'\'' && bytes.get(i + 1) == Some(&b'\'') => {
                i += 2;
                continue;
            }
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None => match b {
                b'#' if before(i).0 => {
                    // A comment, to the end of its line.
                    match bytes[i..].iter().position(|&c| c == b'\n') {
                        Some(n) => i += n,
                        None => return None,
                    }
                    continue;
                }
                b'"' | b'\'' => {
                    let (space, prev) = before(i);
                    if space || matches!(prev, b'[' | b'{' | b',' | b':') {
                        quote = Some(b);
                    }
                }
                b'[' | b'{' => {
                    depth += 1;
                    if depth > MAX_DEPTH {
                        return Some(Pos { line, col: source[line_start..=i].chars().count() });
                    }
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
        i += 1;
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

    /// The char-by-char pass `too_deep` replaced, kept as its reference.
    fn too_deep_by_chars(source: &str) -> Option<Pos> {
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

    #[test]
    fn too_deep_reads_bytes_as_the_char_by_char_pass_read_characters() {
        let deep = |prefix: &str| format!("{prefix}{}", "[".repeat(MAX_DEPTH + 1));
        let mut texts: Vec<String> = vec![
            deep("a: "),
            deep("é: ü\nnodes: "),
            deep("a: \"x\\\ny\" "),
            deep("a: \"x\\é\" "),
            deep("a: 'it''s' "),
            deep("a: b # [[[\n"),
            deep("a:\u{a0}# not a comment? "),
            deep("a:\u{3000}'q' "),
            deep("a: x'y "),
            deep("a: [\"]\", "),
            deep("a: {'}': "),
            deep("\u{1F600}\t\"\u{1F600}\" "),
            deep("a: \"unterminated\n"),
            deep("a: 'line\nbreak' "),
            deep("\r\n\u{b}#x\n"),
            format!("a: '{}'", "[".repeat(100)),
            format!("a: \"{}\\\"{}\"", "[".repeat(40), "{".repeat(40)),
            "a: [b, {c: d}]\n".to_string(),
            String::new(),
        ];
        // Whether a `#` starts a comment, or a quote a quoted scalar, hangs
        // on the character before it being whitespace (Unicode's, as the
        // reference read it): brackets after it count or do not.
        for before in [" ", "\t", "\u{b}", "\u{c}", "\r", "\u{a0}", "\u{3000}", "x", "é", "\u{1F600}", ",", "["] {
            texts.push(format!("a:{before}# {}", "[".repeat(MAX_DEPTH + 1)));
            texts.push(format!("a:{before}'{}'", "[".repeat(MAX_DEPTH + 1)));
            texts.push(format!("a:{before}\"{}\"", "{".repeat(MAX_DEPTH + 1)));
        }
        for f in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../experiments")).unwrap() {
            let path = f.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                texts.push(std::fs::read_to_string(path).unwrap());
            }
        }
        let mut found = 0;
        for t in &texts {
            assert_eq!(too_deep(t), too_deep_by_chars(t), "{t:?}");
            found += usize::from(too_deep(t).is_some());
        }
        // Both answers occur: most of the texts above nest too deep.
        assert!(found >= 12, "only {found} found too deep");
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
