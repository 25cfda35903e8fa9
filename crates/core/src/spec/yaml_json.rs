//! A spec's YAML read straight into JSON from libyaml's events, without
//! building serde_yaml's own value first and converting it, and without
//! serde_yaml's loader, which keeps a whole document's events in one vector
//! before any value is built (a sixth of a 10,000-node spec's `validate`,
//! most of it the vector growing).
//!
//! Only for what the general path ([`super::load`]'s `parse_yaml`: a YAML
//! value, its merge keys applied, converted to JSON) would read the same way:
//! string keys, each once, untagged scalars without anchors, sequences and
//! mappings, one document. Anything else (a merge key, an alias, a tag, a key
//! that is not a string, a repeated key, a number JSON cannot hold, a YAML
//! error) makes this return `None`, and the general path reads the text,
//! giving the value or its error as before. The events are libyaml's, as
//! serde_yaml_ng reads them (the same `unsafe-libyaml`), and a plain scalar
//! is resolved by a copy of serde_yaml_ng's own rules (below), so what this
//! reads is what the general path reads.

use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::num::ParseIntError;

use serde_json::{Map, Number, Value};
use unsafe_libyaml as unsafe_sys;

/// How deep collections may nest here: past it the general path decides
/// (serde_yaml_ng refuses past 128; `locate::too_deep` refuses past 64 first).
const MAX_DEPTH: usize = 100;

/// The text as JSON when the direct reading applies (see the module).
pub(crate) fn parse(text: &str) -> Option<Value> {
    if text.contains("<<") {
        return None;
    }
    let mut parser = Parser::new(text)?;
    let mut stack: Vec<Frame> = Vec::new();
    let mut root: Option<Value> = None;
    let mut documents = 0;
    loop {
        match parser.next()? {
            Event::StreamStart => {}
            Event::DocumentStart => {
                documents += 1;
                if documents > 1 {
                    return None;
                }
            }
            Event::DocumentEnd => {}
            Event::StreamEnd => return root.filter(|_| stack.is_empty()),
            Event::SequenceStart => {
                if stack.len() >= MAX_DEPTH || expects_key(&stack) {
                    return None;
                }
                stack.push(Frame::Seq(Vec::new()));
            }
            Event::MappingStart => {
                if stack.len() >= MAX_DEPTH || expects_key(&stack) {
                    return None;
                }
                stack.push(Frame::Map(Map::new(), None));
            }
            Event::End => {
                let value = match stack.pop()? {
                    Frame::Seq(items) => Value::Array(items),
                    Frame::Map(map, None) => Value::Object(map),
                    Frame::Map(_, Some(_)) => return None,
                };
                put(&mut stack, &mut root, value)?;
            }
            Event::Scalar { value, plain } => {
                let value = if plain { resolve_plain(value)? } else { Value::String(value) };
                put(&mut stack, &mut root, value)?;
            }
            Event::Decline => return None,
        }
    }
}

/// An open collection: a sequence's items, or a mapping's entries and the key
/// whose value comes next.
enum Frame {
    Seq(Vec<Value>),
    Map(Map<String, Value>, Option<String>),
}

fn expects_key(stack: &[Frame]) -> bool {
    matches!(stack.last(), Some(Frame::Map(_, None)))
}

/// Puts a finished value where it belongs: the document's root, a sequence's
/// next item, a mapping's next key (a string, and nothing else) or the value
/// of its key (a key written twice declines).
fn put(stack: &mut [Frame], root: &mut Option<Value>, value: Value) -> Option<()> {
    match stack.last_mut() {
        None if root.is_none() => *root = Some(value),
        None => return None,
        Some(Frame::Seq(items)) => items.push(value),
        Some(Frame::Map(_, key @ None)) => match value {
            Value::String(k) => *key = Some(k),
            _ => return None,
        },
        Some(Frame::Map(map, key @ Some(_))) => {
            if map.insert(key.take().expect("matched Some"), value).is_some() {
                return None;
            }
        }
    }
    Some(())
}

/// One of libyaml's events, as far as this reading needs it.
enum Event {
    StreamStart,
    StreamEnd,
    DocumentStart,
    DocumentEnd,
    SequenceStart,
    MappingStart,
    /// A sequence's or a mapping's end.
    End,
    Scalar {
        value: String,
        plain: bool,
    },
    /// An alias, an anchor, a tag or bytes that are not UTF-8: the general
    /// path reads it.
    Decline,
}

/// libyaml's parser over a text, deleted when dropped.
struct Parser<'t> {
    sys: Box<MaybeUninit<unsafe_sys::yaml_parser_t>>,
    text: PhantomData<&'t str>,
}

impl<'t> Parser<'t> {
    fn new(text: &'t str) -> Option<Parser<'t>> {
        let mut sys = Box::new(MaybeUninit::<unsafe_sys::yaml_parser_t>::uninit());
        let parser = sys.as_mut_ptr();
        // SAFETY: as serde_yaml_ng's own parser: the struct is initialized by
        // libyaml in place (boxed, so it never moves), and reads `text`,
        // which outlives it ('t), by pointer and length.
        unsafe {
            if unsafe_sys::yaml_parser_initialize(parser).fail {
                return None;
            }
            unsafe_sys::yaml_parser_set_encoding(parser, unsafe_sys::YAML_UTF8_ENCODING);
            unsafe_sys::yaml_parser_set_input_string(parser, text.as_ptr(), text.len() as u64);
        }
        Some(Parser { sys, text: PhantomData })
    }

    /// The next event; `None` at a YAML error.
    fn next(&mut self) -> Option<Event> {
        let mut raw = MaybeUninit::<unsafe_sys::yaml_event_t>::uninit();
        // SAFETY: the parser was initialized in `new`; an event libyaml
        // filled in is read only before `yaml_event_delete` frees it, and
        // what is kept of it is copied out (the scalar's bytes).
        unsafe {
            let parser = self.sys.as_mut_ptr();
            let error = (&*parser).error;
            if error != unsafe_sys::YAML_NO_ERROR || unsafe_sys::yaml_parser_parse(parser, raw.as_mut_ptr()).fail {
                return None;
            }
            let event = &*raw.as_ptr();
            let converted = match event.type_ {
                unsafe_sys::YAML_STREAM_START_EVENT => Event::StreamStart,
                unsafe_sys::YAML_STREAM_END_EVENT => Event::StreamEnd,
                unsafe_sys::YAML_DOCUMENT_START_EVENT => Event::DocumentStart,
                unsafe_sys::YAML_DOCUMENT_END_EVENT => Event::DocumentEnd,
                unsafe_sys::YAML_SEQUENCE_START_EVENT => {
                    let s = &event.data.sequence_start;
                    if s.anchor.is_null() && s.tag.is_null() {
                        Event::SequenceStart
                    } else {
                        Event::Decline
                    }
                }
                unsafe_sys::YAML_MAPPING_START_EVENT => {
                    let m = &event.data.mapping_start;
                    if m.anchor.is_null() && m.tag.is_null() {
                        Event::MappingStart
                    } else {
                        Event::Decline
                    }
                }
                unsafe_sys::YAML_SEQUENCE_END_EVENT | unsafe_sys::YAML_MAPPING_END_EVENT => Event::End,
                unsafe_sys::YAML_SCALAR_EVENT => {
                    let s = &event.data.scalar;
                    let bytes = std::slice::from_raw_parts(s.value, s.length as usize);
                    match std::str::from_utf8(bytes) {
                        Ok(text) if s.anchor.is_null() && s.tag.is_null() => Event::Scalar {
                            value: text.to_string(),
                            plain: s.style == unsafe_sys::YAML_PLAIN_SCALAR_STYLE,
                        },
                        _ => Event::Decline,
                    }
                }
                _ => Event::Decline,
            };
            unsafe_sys::yaml_event_delete(raw.as_mut_ptr());
            Some(converted)
        }
    }
}

impl Drop for Parser<'_> {
    fn drop(&mut self) {
        // SAFETY: initialized in `new` (a failed initialization builds no Parser).
        unsafe { unsafe_sys::yaml_parser_delete(self.sys.as_mut_ptr()) }
    }
}

/// An untagged plain scalar's value, by serde_yaml_ng's rules
/// (`visit_untagged_scalar`), or `None` where the general path would not
/// give the same JSON: an integer past 64 bits, or a float JSON cannot hold
/// (`.inf`, `.nan`).
fn resolve_plain(v: String) -> Option<Value> {
    if v.is_empty() || matches!(v.as_str(), "null" | "Null" | "NULL" | "~") {
        return Some(Value::Null);
    }
    match v.as_str() {
        "true" | "True" | "TRUE" => return Some(Value::Bool(true)),
        "false" | "False" | "FALSE" => return Some(Value::Bool(false)),
        _ => {}
    }
    if let Some(int) = parse_unsigned_int(&v, u64::from_str_radix) {
        return Some(Value::Number(int.into()));
    }
    if let Some(int) = parse_negative_int(&v, i64::from_str_radix) {
        return Some(Value::Number(int.into()));
    }
    if parse_unsigned_int(&v, u128::from_str_radix).is_some() || parse_negative_int(&v, i128::from_str_radix).is_some()
    {
        return None;
    }
    if !digits_but_not_number(&v) {
        if let Some(float) = parse_f64(&v) {
            return Number::from_f64(float).map(Value::Number);
        }
    }
    Some(Value::String(v))
}

// The four functions below are serde_yaml_ng 0.10.0's (src/de.rs, MIT or
// Apache-2.0), the same checks in the same order (its three prefix checks
// written as a loop), so a plain scalar resolves here exactly as there.

fn parse_unsigned_int<T>(scalar: &str, from_str_radix: fn(&str, radix: u32) -> Result<T, ParseIntError>) -> Option<T> {
    let unpositive = scalar.strip_prefix('+').unwrap_or(scalar);
    for (prefix, radix) in [("0x", 16), ("0o", 8), ("0b", 2)] {
        if let Some(rest) = unpositive.strip_prefix(prefix) {
            if rest.starts_with(['+', '-']) {
                return None;
            }
            if let Ok(int) = from_str_radix(rest, radix) {
                return Some(int);
            }
        }
    }
    if unpositive.starts_with(['+', '-']) {
        return None;
    }
    if digits_but_not_number(scalar) {
        return None;
    }
    from_str_radix(unpositive, 10).ok()
}

fn parse_negative_int<T>(scalar: &str, from_str_radix: fn(&str, radix: u32) -> Result<T, ParseIntError>) -> Option<T> {
    for (prefix, radix) in [("-0x", 16), ("-0o", 8), ("-0b", 2)] {
        if let Some(rest) = scalar.strip_prefix(prefix) {
            let negative = format!("-{rest}");
            if let Ok(int) = from_str_radix(&negative, radix) {
                return Some(int);
            }
        }
    }
    if digits_but_not_number(scalar) {
        return None;
    }
    from_str_radix(scalar, 10).ok()
}

fn parse_f64(scalar: &str) -> Option<f64> {
    let unpositive = if let Some(unpositive) = scalar.strip_prefix('+') {
        if unpositive.starts_with(['+', '-']) {
            return None;
        }
        unpositive
    } else {
        scalar
    };
    if let ".inf" | ".Inf" | ".INF" = unpositive {
        return Some(f64::INFINITY);
    }
    if let "-.inf" | "-.Inf" | "-.INF" = scalar {
        return Some(f64::NEG_INFINITY);
    }
    if let ".nan" | ".NaN" | ".NAN" = scalar {
        return Some(f64::NAN.copysign(1.0));
    }
    if let Ok(float) = unpositive.parse::<f64>() {
        if float.is_finite() {
            return Some(float);
        }
    }
    None
}

fn digits_but_not_number(scalar: &str) -> bool {
    // Leading zero(s) followed by numeric characters is a string according to
    // the YAML 1.2 spec. https://yaml.org/spec/1.2/spec.html#id2761292
    let scalar = scalar.strip_prefix(['-', '+']).unwrap_or(scalar);
    scalar.len() > 1 && scalar.starts_with('0') && scalar[1..].bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The general path, as `load` reads a file without the direct one.
    fn general(text: &str) -> Option<Value> {
        let mut yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).ok()?;
        yaml.apply_merge().ok()?;
        serde_json::to_value(&yaml).ok()
    }

    /// Every spec in the repository, and YAML written to trip it: where the
    /// direct reading gives a value, the general path gives the same one;
    /// where the general path fails or reads something else (merge keys,
    /// tags, keys that are not strings, repeated keys, non-finite numbers),
    /// the direct reading declines.
    #[test]
    fn the_direct_reading_gives_the_general_paths_value_or_declines() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut texts = Vec::new();
        let mut stack = vec![root.join("experiments"), root.join("tests"), root.join("docs")];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let path = entry.path();
                if entry.file_type().unwrap().is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                    texts.push((path.display().to_string(), std::fs::read_to_string(&path).unwrap()));
                }
            }
        }
        assert!(texts.len() >= 10, "found only {} YAML files", texts.len());
        let direct_count = texts.iter().filter(|(_, t)| parse(t).is_some()).count();
        assert!(direct_count * 2 >= texts.len(), "the direct reading declined most specs: {direct_count}");
        let tricky = [
            "a: 1\nb: [1, 2.5, -3, 1e3, true, null, ~, 'x', \"y\"]\nc: {d: {e: f}}\n",
            "yes: on\nno: off\nempty:\nlist:\n  - a\n  -\n",
            "base: &b {x: 1}\nuse: *b\n",
            "base: &b {x: 1}\nmerged:\n  <<: *b\n  y: 2\n",
            "1: one\n2.5: two\ntrue: three\n",
            "~: nothing\n",
            "[a]: sequence key\n",
            "a: 1\na: 2\n",
            "nodes:\n  x: {op: shell}\n  x: {op: shell}\n",
            "tagged: !custom value\n",
            "tagged: !!str 12\n",
            "inf: .inf\nnan: .nan\n",
            "big: 18446744073709551615\nneg: -9223372036854775808\n",
            "text: |\n  line one\n  line two\n",
            "- a\n- b\n",
            "",
            "a: [unclosed\n",
            "---\na: 1\n---\nb: 2\n",
            "hex: 0x1F\noct: 0o17\nbin: 0b101\nplus: +12\nneghex: -0x1F\nzero: 012\nunder: 1_000\n",
            "e: 1e3\nhalf: .5\nplushalf: +.5\ndot: 0.\nlr: 1.0e-4\nzz: 00\nnegzero: -0\nbad: ++1\n",
            "q: '12'\nd: \"true\"\nT: True\nN: NULL\nt: ~\nstr: 0x\nsci: 1E+2\n",
            "plain: a multi\n  line scalar\nesc: \"caf\\u00e9\\tx\"\nsingle: 'it''s'\nfolded: >-\n  one\n  two\n",
            "'123': quoted key\n\"null\": quoted null key\n? complex\n: value\n",
            "--- \nonly: one\n...\n",
            "a:\n  - b: [1, {c: d}]\n  - []\n  - {}\n",
            "%YAML 1.1\n---\na: 1\n",
            "a: &x 1\n",
            "a: !!int 3\n",
            "huge: 340282366920938463463374607431768211455\n",
            "nested: {a: {b: {c: [1, [2, [3]]]}}}\n",
        ];
        for (name, text) in texts.iter().map(|(n, t)| (n.as_str(), t.as_str())).chain(tricky.iter().map(|t| (*t, *t))) {
            if let Some(direct) = parse(text) {
                assert_eq!(Some(direct), general(text), "{name}");
            }
        }
        // What specs are made of reads directly (the general path is not asked).
        for read in [0, 1, 12, 13, 14, 18, 19, 20, 21, 22, 23, 24, 29].map(|i| tricky[i]) {
            assert!(parse(read).is_some(), "declined: {read}");
        }
        for declined in [
            "a: 1\na: 2\n",
            "tagged: !custom value\n",
            "~: nothing\n",
            "1: one\n",
            "inf: .inf\n",
            "a: &x 1\n",
            "a: !!int 3\n",
            "huge: 340282366920938463463374607431768211455\n",
            "[a]: sequence key\n",
            "---\na: 1\n---\nb: 2\n",
            "a: [unclosed\n",
        ] {
            assert_eq!(parse(declined), None, "{declined}");
        }
        assert_eq!(parse("base: &b {x: 1}\nmerged:\n  <<: *b\n"), None);
    }
}
