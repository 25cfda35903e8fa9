//! The grammar of node ids, and how any id (or other outside text) is shown.
//!
//! A node id becomes a folder name in a pack (`outputs/<id>/…`), a line of
//! SHA256SUMS, a column of `status`, and a word on a terminal. So an id is:
//!
//! - a **base id** (the key under `nodes:`): 1 to 128 characters, ASCII letters,
//!   digits and `_ - . +`, starting with a letter, a digit or `_` (so never
//!   `.`, `..`, a hidden name or something that reads as a flag);
//! - then, for a matrix expansion, `@axis=value,axis=value` (axes sorted),
//!   where an axis is a dotted param path and a value is the matrix value as
//!   written: any text without control characters (newline, CR, tab, ESC, …),
//!   Unicode format and bidirectional controls, whitespace, `/` or `\`,
//!   at most 512 characters in all.
//!
//! `validate` refuses anything else, naming the id. Ids that reach a terminal
//! from elsewhere (an old index, a pack) go through [`escaped`] all the same.

/// The first 12 characters of a hash, a key or a lineage, as shown to
/// people (all of a shorter text). Counted in characters, so outside text (a
/// name a worker sent) is never cut inside one.
pub fn short(text: &str) -> &str {
    text.char_indices().nth(12).map_or(text, |(end, _)| &text[..end])
}

/// The longest base id.
pub const MAX_BASE_ID: usize = 128;
/// The longest expanded id.
pub const MAX_ID: usize = 512;

/// Why a base id (a key under `nodes:`) is not one, or `None`.
pub fn base_id_problem(id: &str) -> Option<String> {
    let first_ok = id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    if id.is_empty() || id.len() > MAX_BASE_ID {
        return Some(format!("a node id has 1 to {MAX_BASE_ID} characters"));
    }
    if !first_ok {
        return Some("a node id starts with a letter, a digit or '_'".into());
    }
    if let Some(c) = id.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '+'))) {
        return Some(format!(
            "{} is not allowed: a node id is ASCII letters, digits and _ - . + (see docs/specs.md, Node ids)",
            describe_char(c)
        ));
    }
    None
}

/// Why an expanded id (`base@axis=value,…`) is not one, or `None`.
pub fn id_problem(id: &str) -> Option<String> {
    let (base, rest) = id.split_once('@').unwrap_or((id, ""));
    if let Some(p) = base_id_problem(base) {
        return Some(p);
    }
    if id.chars().count() > MAX_ID {
        return Some(format!("an expanded node id has at most {MAX_ID} characters"));
    }
    if let Some(c) = rest.chars().find(|&c| forbidden_in_value(c)) {
        return Some(format!(
            "{} is not allowed in a matrix value that becomes part of a node id (no control or format \
             characters, whitespace, '/' or '\\'); give the axis named values (`values: {{label: value}}`)",
            describe_char(c)
        ));
    }
    None
}

fn forbidden_in_value(c: char) -> bool {
    c.is_control() || c.is_whitespace() || c == '/' || c == '\\' || is_format_control(c)
}

/// Unicode's invisible format and bidirectional controls (category Cf, the
/// ones that change how a line reads: Trojan Source's characters among them).
fn is_format_control(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{061C}' | '\u{180E}'
        | '\u{200B}'..='\u{200F}'
        | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}'
        | '\u{FEFF}'
        | '\u{FFF9}'..='\u{FFFB}'
        | '\u{E0000}'..='\u{E007F}')
}

fn describe_char(c: char) -> String {
    if c.is_control() || c.is_whitespace() || is_format_control(c) {
        format!("the character U+{:04X}", c as u32)
    } else {
        format!("'{c}'")
    }
}

/// Text made safe to print on a terminal or in a one-line log: control,
/// format and bidirectional characters are written as `\u{…}` (a backslash
/// as `\\`), so nothing can move the cursor, recolour or reorder a line.
/// Text without them is returned unchanged.
pub fn escaped(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c == '\\' || c.is_control() || is_format_control(c)) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else if c.is_control() || is_format_control(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// As [`escaped`], but newlines are kept: for a multi-line message (a
/// failure with a log's last lines) whose other controls must not reach a
/// terminal raw (a CR could overwrite a FAILED line).
pub fn escaped_lines(text: &str) -> String {
    text.split('\n').map(|line| escaped(line).into_owned()).collect::<Vec<_>>().join("\n")
}

/// At most `max` characters of a file's text, escaped, for an error message
/// about a file that is not a spec: enough to recognise it, never its content.
pub fn excerpt(text: &str, max: usize) -> String {
    let cut: String = text.chars().take(max).collect();
    let more = if text.chars().nth(max).is_some() { "…" } else { "" };
    format!("{}{more}", escaped(&cut))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_could_leave_a_folder_or_rewrite_a_line_are_refused() {
        for good in ["train", "sft_2", "grpo-main.v2", "a+b", "_x", "9lives"] {
            assert_eq!(base_id_problem(good), None, "{good}");
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "-rf",
            "a/b",
            "a b",
            "a:b",
            "a@b",
            "a\nb",
            "a\rb",
            "a\tb",
            "a\u{1b}[2Kb",
            "a\u{202e}b",
            "é",
        ] {
            assert!(base_id_problem(bad).is_some(), "{bad:?}");
        }
        assert!(base_id_problem(&"a".repeat(129)).is_some());
        assert_eq!(id_problem("grpo@lr=1e-05,mode=continuous"), None);
        assert_eq!(id_problem("f@faults=[{\"family\":\"F1\"}]"), None);
        for bad in ["x@v=../..", "x@v=a\nb", "x@v=a b", "x@v=\u{1b}[1A", "x@v=a\\b", "x@v=\u{2066}", "..@v=1"] {
            assert!(id_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn escaping_shows_every_control_and_leaves_plain_text_alone() {
        assert!(matches!(escaped("train@lr=0.1"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(escaped("a\u{1b}[2K\rFAILED\n"), "a\\u{1b}[2K\\u{d}FAILED\\u{a}");
        assert_eq!(escaped("x\u{202e}y"), "x\\u{202e}y");
        assert_eq!(escaped("a\\u{1b}"), "a\\\\u{1b}", "an escape cannot be forged");
        assert_eq!(escaped_lines("a\rb\nc"), "a\\u{d}b\nc");
        assert_eq!(excerpt("root:x:0:0:secret\nmore", 4), "root…");
    }
}
