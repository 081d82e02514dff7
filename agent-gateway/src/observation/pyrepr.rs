//! A small parser for the Python `repr` of dataclass lists, as AndroidWorld tools print
//! `UIElement` lists, into a `serde_json::Value`.
//!
//! Grammar (whitespace allowed between tokens):
//! `value := None | True | False | number | string | list | tuple | dict | call`;
//! `call := NAME "(" [NAME "=" value {"," NAME "=" value} [","]] ")"` becomes an object with
//! the keyword arguments as fields; a call with exactly one positional argument
//! (`np.int64(5)`) becomes that argument. Strings are `'...'` or `"..."` with Python escapes
//! (`\\ \' \" \n \r \t \xhh \uhhhh \Uhhhhhhhh`). Lists and tuples become arrays; dicts with
//! string keys become objects. The whole text must be one value.

use serde_json::{Map, Number, Value};

use crate::error::ObservationError;

/// Deepest nesting accepted (protects the recursive parser's stack).
const MAX_DEPTH: usize = 64;

/// Parse `text` as one Python literal. Errors: [`ObservationError::MalformedElements`] with the
/// 1-based line and column (in chars) of the offending character.
pub(crate) fn parse(text: &str) -> Result<Value, ObservationError> {
    let mut p = Parser { s: text, pos: 0 };
    let v = p.value(0)?;
    p.skip_ws();
    if p.pos != text.len() {
        return Err(p.error("trailing characters after the value"));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn error(&self, message: &str) -> ObservationError {
        let before = &self.s[..self.pos.min(self.s.len())];
        let line = before.matches('\n').count() as u32 + 1;
        let column = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) as u32 + 1;
        let found: String = self.s[self.pos.min(self.s.len())..].chars().take(20).collect();
        ObservationError::MalformedElements { line, column, message: format!("{message} (at {found:?})") }
    }

    fn peek(&self) -> Option<char> {
        self.s[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    /// After an item of a list, dict or call body: skips the `,` before the next item, or
    /// stops before `close`; anything else is an error.
    fn item_separator(&mut self, close: char) -> Result<(), ObservationError> {
        self.skip_ws();
        match self.peek() {
            Some(',') => {
                self.bump();
                Ok(())
            }
            Some(c) if c == close => Ok(()),
            _ => Err(self.error(&format!("expected ',' or {close:?}"))),
        }
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.bump();
        }
    }

    fn expect(&mut self, c: char) -> Result<(), ObservationError> {
        self.skip_ws();
        if self.peek() == Some(c) {
            self.bump();
            Ok(())
        } else {
            Err(self.error(&format!("expected {c:?}")))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, ObservationError> {
        if depth > MAX_DEPTH {
            return Err(self.error("nesting too deep"));
        }
        self.skip_ws();
        match self.peek() {
            Some('[') => {
                self.bump();
                Ok(Value::Array(self.sequence(']', depth)?))
            }
            Some('(') => {
                self.bump();
                Ok(Value::Array(self.sequence(')', depth)?))
            }
            Some('{') => self.dict(depth),
            Some('\'') | Some('"') => Ok(Value::String(self.string()?)),
            Some(c) if c == '-' || c == '+' || c.is_ascii_digit() => self.number(),
            Some(c) if c.is_alphabetic() || c == '_' => self.name_or_call(depth),
            Some(_) => Err(self.error("expected a Python literal")),
            None => Err(self.error("unexpected end of text")),
        }
    }

    /// Comma-separated values up to `close` (the opener is already consumed).
    fn sequence(&mut self, close: char, depth: usize) -> Result<Vec<Value>, ObservationError> {
        let mut items = Vec::new();
        loop {
            self.skip_ws();
            if self.peek() == Some(close) {
                self.bump();
                return Ok(items);
            }
            items.push(self.value(depth + 1)?);
            self.item_separator(close)?;
        }
    }

    fn dict(&mut self, depth: usize) -> Result<Value, ObservationError> {
        self.expect('{')?;
        let mut map = Map::new();
        loop {
            self.skip_ws();
            if self.peek() == Some('}') {
                self.bump();
                return Ok(Value::Object(map));
            }
            let key = match self.value(depth + 1)? {
                Value::String(s) => s,
                other => other.to_string(),
            };
            self.expect(':')?;
            let v = self.value(depth + 1)?;
            map.insert(key, v);
            self.item_separator('}')?;
        }
    }

    fn ident(&mut self) -> &'a str {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.') {
            self.bump();
        }
        &self.s[start..self.pos]
    }

    fn name_or_call(&mut self, depth: usize) -> Result<Value, ObservationError> {
        let start = self.pos;
        let name = self.ident();
        self.skip_ws();
        if self.peek() != Some('(') {
            return match name {
                "None" => Ok(Value::Null),
                "True" => Ok(Value::Bool(true)),
                "False" => Ok(Value::Bool(false)),
                _ => {
                    self.pos = start;
                    Err(self.error("unknown name"))
                }
            };
        }
        self.bump();
        let mut map = Map::new();
        let mut positional = Vec::new();
        loop {
            self.skip_ws();
            if self.peek() == Some(')') {
                self.bump();
                break;
            }
            // Keyword argument `k=v`, or a positional value.
            let save = self.pos;
            let key = self.ident();
            self.skip_ws();
            if !key.is_empty() && self.peek() == Some('=') {
                self.bump();
                let v = self.value(depth + 1)?;
                map.insert(key.to_string(), v);
            } else {
                self.pos = save;
                positional.push(self.value(depth + 1)?);
            }
            self.item_separator(')')?;
        }
        match (positional.len(), map.is_empty()) {
            (0, _) => Ok(Value::Object(map)),
            (1, true) => Ok(positional.pop().unwrap_or(Value::Null)),
            _ => Err(self.error("calls with positional arguments are not supported")),
        }
    }

    fn number(&mut self) -> Result<Value, ObservationError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit() || matches!(c, '-' | '+' | '.' | 'e' | 'E')) {
            self.bump();
        }
        let lit = &self.s[start..self.pos];
        if let Ok(i) = lit.parse::<i64>() {
            return Ok(Value::Number(i.into()));
        }
        match lit.parse::<f64>().ok().and_then(Number::from_f64) {
            Some(n) => Ok(Value::Number(n)),
            None => {
                self.pos = start;
                Err(self.error("invalid number"))
            }
        }
    }

    fn string(&mut self) -> Result<String, ObservationError> {
        let quote = self.bump().ok_or_else(|| self.error("expected a string"))?;
        let mut out = String::new();
        loop {
            match self.bump() {
                None => return Err(self.error("unterminated string")),
                Some(c) if c == quote => return Ok(out),
                Some('\\') => {
                    let esc = self.bump().ok_or_else(|| self.error("unterminated escape"))?;
                    match esc {
                        'n' => out.push('\n'),
                        'r' => out.push('\r'),
                        't' => out.push('\t'),
                        '0' => out.push('\0'),
                        '\\' | '\'' | '"' => out.push(esc),
                        'x' => out.push(self.hex_char(2)?),
                        'u' => out.push(self.hex_char(4)?),
                        'U' => out.push(self.hex_char(8)?),
                        '\n' => {}
                        other => {
                            out.push('\\');
                            out.push(other);
                        }
                    }
                }
                Some(c) => out.push(c),
            }
        }
    }

    fn hex_char(&mut self, digits: usize) -> Result<char, ObservationError> {
        let start = self.pos;
        let end = start + digits;
        let hex = self.s.get(start..end).ok_or_else(|| self.error("truncated escape"))?;
        let code = u32::from_str_radix(hex, 16).map_err(|_| self.error("invalid hex escape"))?;
        self.pos = end;
        Ok(char::from_u32(code).unwrap_or('\u{fffd}'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn literals_and_calls() {
        let v = parse("[A(x=None, y=True, z=-3, w=2.5, s='it\\'s', t=\"\\u00e9\", b=B(k=[1, (2, 3)]), d={'a': 1}), np.int64(7)]").unwrap();
        assert_eq!(
            v,
            json!([{"x": null, "y": true, "z": -3, "w": 2.5, "s": "it's", "t": "é", "b": {"k": [1, [2, 3]]}, "d": {"a": 1}}, 7])
        );
    }

    #[test]
    fn errors_have_positions() {
        match parse("[A(x=1,\n  y=)]") {
            Err(ObservationError::MalformedElements { line, column, .. }) => {
                assert_eq!(line, 2);
                assert_eq!(column, 5);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(parse("[1, 2"), Err(ObservationError::MalformedElements { .. })));
        assert!(matches!(parse("'abc"), Err(ObservationError::MalformedElements { .. })));
        assert!(matches!(parse("[1] junk"), Err(ObservationError::MalformedElements { .. })));
        assert!(matches!(parse("Foo"), Err(ObservationError::MalformedElements { .. })));
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let deep = "[".repeat(10_000);
        assert!(matches!(parse(&deep), Err(ObservationError::MalformedElements { .. })));
    }
}
