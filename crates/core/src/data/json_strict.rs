//! A strict JSON reader (RFC 8259) for verifying model outputs. serde_json is
//! not used here because it lets a duplicate key silently win and reports
//! `NaN` as any other syntax error; the verifier must say exactly which rule
//! a response broke. Nothing is evaluated: this only reads text.

/// A parsed JSON value; objects keep their pairs in order so duplicates are visible.
#[derive(Debug, Clone, PartialEq)]
pub enum JsonValue {
    Null,
    Bool(bool),
    Number(JsonNumber),
    String(String),
    Array(Vec<JsonValue>),
    Object(Vec<(String, JsonValue)>),
}

/// A number as written. `integer` is set only for integer syntax (no fraction,
/// no exponent), so `12.0` and `1e1` stay distinguishable from `12` and `10`.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonNumber {
    pub text: String,
    pub integer: Option<i128>,
}

/// Why a text is not exactly one JSON value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Not JSON at all (with what went wrong and where).
    Syntax(String),
    /// `NaN`, `Infinity` or `-Infinity`.
    NonFinite,
    /// An object has the same key twice.
    DuplicateKey(String),
    /// A second JSON value follows the first.
    MultipleValues,
    /// Non-JSON text follows the value.
    TrailingText,
}

const MAX_DEPTH: usize = 64;

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

/// Parses exactly one JSON value surrounded by optional JSON whitespace.
pub fn parse_one(text: &str) -> Result<JsonValue, ParseError> {
    let mut p = Parser { s: text.as_bytes(), i: 0 };
    p.ws();
    let v = p.value(0)?;
    p.ws();
    if p.i < p.s.len() {
        let rest = &p.s[p.i..];
        let mut probe = Parser { s: rest, i: 0 };
        return Err(if probe.value(0).is_ok() { ParseError::MultipleValues } else { ParseError::TrailingText });
    }
    Ok(v)
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn err<T>(&self, what: &str) -> Result<T, ParseError> {
        Err(ParseError::Syntax(format!("{what} at byte {}", self.i)))
    }

    fn eat(&mut self, lit: &[u8]) -> bool {
        if self.s[self.i..].starts_with(lit) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<JsonValue, ParseError> {
        if depth > MAX_DEPTH {
            return self.err("nesting too deep");
        }
        match self.s.get(self.i) {
            None => self.err("unexpected end"),
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => Ok(JsonValue::String(self.string()?)),
            Some(b't') if self.eat(b"true") => Ok(JsonValue::Bool(true)),
            Some(b'f') if self.eat(b"false") => Ok(JsonValue::Bool(false)),
            Some(b'n') if self.eat(b"null") => Ok(JsonValue::Null),
            Some(b'N') if self.eat(b"NaN") => Err(ParseError::NonFinite),
            Some(b'I') if self.eat(b"Infinity") => Err(ParseError::NonFinite),
            Some(b'-') if self.s[self.i..].starts_with(b"-Infinity") => Err(ParseError::NonFinite),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => self.err("unexpected character"),
        }
    }

    fn object(&mut self, depth: usize) -> Result<JsonValue, ParseError> {
        self.i += 1;
        let mut pairs: Vec<(String, JsonValue)> = Vec::new();
        self.ws();
        if self.eat(b"}") {
            return Ok(JsonValue::Object(pairs));
        }
        loop {
            self.ws();
            if self.s.get(self.i) != Some(&b'"') {
                return self.err("expected a string key");
            }
            let key = self.string()?;
            self.ws();
            if !self.eat(b":") {
                return self.err("expected ':'");
            }
            self.ws();
            let v = self.value(depth + 1)?;
            if pairs.iter().any(|(k, _)| *k == key) {
                return Err(ParseError::DuplicateKey(key));
            }
            pairs.push((key, v));
            self.ws();
            if self.eat(b",") {
                continue;
            }
            if self.eat(b"}") {
                return Ok(JsonValue::Object(pairs));
            }
            return self.err("expected ',' or '}'");
        }
    }

    fn array(&mut self, depth: usize) -> Result<JsonValue, ParseError> {
        self.i += 1;
        let mut items = Vec::new();
        self.ws();
        if self.eat(b"]") {
            return Ok(JsonValue::Array(items));
        }
        loop {
            self.ws();
            items.push(self.value(depth + 1)?);
            self.ws();
            if self.eat(b",") {
                continue;
            }
            if self.eat(b"]") {
                return Ok(JsonValue::Array(items));
            }
            return self.err("expected ',' or ']'");
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Result<JsonValue, ParseError> {
        let start = self.i;
        self.eat(b"-");
        match self.s.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return self.err("expected a digit"),
        }
        let mut integer = true;
        if self.eat(b".") {
            integer = false;
            if self.digits() == 0 {
                return self.err("expected a digit after '.'");
            }
        }
        if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
            integer = false;
            self.i += 1;
            if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if self.digits() == 0 {
                return self.err("expected a digit in the exponent");
            }
        }
        let text = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
        let integer = if integer { text.parse::<i128>().ok() } else { None };
        Ok(JsonValue::Number(JsonNumber { text, integer }))
    }

    fn hex4(&mut self) -> Result<u32, ParseError> {
        let Some(h) = self.s.get(self.i..self.i + 4) else { return self.err("short \\u escape") };
        let h = std::str::from_utf8(h).ok().and_then(|h| u32::from_str_radix(h, 16).ok());
        let Some(v) = h else { return self.err("bad \\u escape") };
        self.i += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, ParseError> {
        self.i += 1;
        let mut out = String::new();
        loop {
            let Some(&b) = self.s.get(self.i) else { return self.err("unterminated string") };
            match b {
                b'"' => {
                    self.i += 1;
                    return Ok(out);
                }
                b'\\' => {
                    self.i += 1;
                    let Some(&e) = self.s.get(self.i) else { return self.err("unterminated escape") };
                    self.i += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xD800..0xDC00).contains(&hi) {
                                if !self.eat(b"\\u") {
                                    return self.err("lone surrogate");
                                }
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return self.err("bad surrogate pair");
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            match char::from_u32(code) {
                                Some(c) => out.push(c),
                                None => return self.err("invalid code point"),
                            }
                        }
                        _ => return self.err("unknown escape"),
                    }
                }
                0x00..=0x1f => return self.err("control character in string"),
                _ => {
                    // Copy one UTF-8 character (the input is a &str, so it is valid).
                    let len = match b {
                        0x00..=0x7f => 1,
                        0xc0..=0xdf => 2,
                        0xe0..=0xef => 3,
                        _ => 4,
                    };
                    let end = (self.i + len).min(self.s.len());
                    out.push_str(&String::from_utf8_lossy(&self.s[self.i..end]));
                    self.i = end;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nested_values_and_escapes() {
        let v = parse_one(r#" {"a": [1, -2.5e3, true, null], "b": "x\u00e9\ud83d\ude00\n"} "#).unwrap();
        let JsonValue::Object(pairs) = v else { panic!() };
        assert_eq!(pairs[1].1, JsonValue::String("xé😀\n".into()));
    }

    #[test]
    fn keeps_integer_and_float_syntax_apart() {
        let int = |t: &str| match parse_one(t).unwrap() {
            JsonValue::Number(n) => n.integer,
            _ => panic!(),
        };
        assert_eq!(int("12"), Some(12));
        assert_eq!(int("-0"), Some(0));
        assert_eq!(int("12.0"), None);
        assert_eq!(int("1e1"), None);
    }

    #[test]
    fn says_which_rule_was_broken() {
        assert_eq!(parse_one("NaN"), Err(ParseError::NonFinite));
        assert_eq!(parse_one("-Infinity"), Err(ParseError::NonFinite));
        assert_eq!(parse_one(r#"{"a":1,"a":2}"#), Err(ParseError::DuplicateKey("a".into())));
        assert_eq!(parse_one("{} {}"), Err(ParseError::MultipleValues));
        assert_eq!(parse_one("{} done"), Err(ParseError::TrailingText));
        assert!(matches!(parse_one("012"), Err(ParseError::MultipleValues)));
        assert!(matches!(parse_one("{'a': 1}"), Err(ParseError::Syntax(_))));
        assert!(matches!(parse_one("\"a\tb\""), Err(ParseError::Syntax(_))));
        assert!(matches!(parse_one(&"[".repeat(100)), Err(ParseError::Syntax(_))));
    }
}
