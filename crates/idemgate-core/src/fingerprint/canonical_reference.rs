//! The first, straightforward canonicalizer, kept as the oracle the optimized one
//! must agree with byte for byte (a changed canonical form would turn retries into
//! 422s). Test-only.

use super::{MAX_DEPTH, NotCanonical};

/// The canonical form of a JSON text.
pub(super) fn canonicalize(input: &[u8]) -> Result<Vec<u8>, NotCanonical> {
    let mut parser = Parser { input, pos: 0 };
    let mut out = Vec::with_capacity(input.len());
    parser.skip_whitespace();
    parser.value(&mut out, 0)?;
    parser.skip_whitespace();
    if parser.pos != input.len() {
        return Err(NotCanonical::Syntax);
    }
    Ok(out)
}

struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn next(&mut self) -> Result<u8, NotCanonical> {
        let byte = self.peek().ok_or(NotCanonical::Syntax)?;
        self.pos += 1;
        Ok(byte)
    }

    fn expect(&mut self, byte: u8) -> Result<(), NotCanonical> {
        if self.next()? == byte {
            Ok(())
        } else {
            Err(NotCanonical::Syntax)
        }
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn value(&mut self, out: &mut Vec<u8>, depth: usize) -> Result<(), NotCanonical> {
        if depth > MAX_DEPTH {
            return Err(NotCanonical::TooDeep);
        }
        match self.peek().ok_or(NotCanonical::Syntax)? {
            b'{' => self.object(out, depth),
            b'[' => self.array(out, depth),
            b'"' => {
                let s = self.string()?;
                write_string(out, &s);
                Ok(())
            }
            b't' => self.literal(out, b"true"),
            b'f' => self.literal(out, b"false"),
            b'n' => self.literal(out, b"null"),
            b'-' | b'0'..=b'9' => self.number(out),
            _ => Err(NotCanonical::Syntax),
        }
    }

    fn literal(&mut self, out: &mut Vec<u8>, word: &[u8]) -> Result<(), NotCanonical> {
        if self.input[self.pos..].starts_with(word) {
            self.pos += word.len();
            out.extend_from_slice(word);
            Ok(())
        } else {
            Err(NotCanonical::Syntax)
        }
    }

    fn object(&mut self, out: &mut Vec<u8>, depth: usize) -> Result<(), NotCanonical> {
        self.expect(b'{')?;
        let mut members: Vec<(String, Vec<u8>)> = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
        } else {
            loop {
                self.skip_whitespace();
                if self.peek() != Some(b'"') {
                    return Err(NotCanonical::Syntax);
                }
                let name = self.string()?;
                self.skip_whitespace();
                self.expect(b':')?;
                self.skip_whitespace();
                let mut value = Vec::new();
                self.value(&mut value, depth + 1)?;
                members.push((name, value));
                self.skip_whitespace();
                match self.next()? {
                    b',' => continue,
                    b'}' => break,
                    _ => return Err(NotCanonical::Syntax),
                }
            }
        }
        // RFC 8785 §3.2.3: order by the UTF-16 code units of the unescaped names.
        members.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
        if members.windows(2).any(|pair| pair[0].0 == pair[1].0) {
            return Err(NotCanonical::DuplicateMember);
        }
        out.push(b'{');
        for (i, (name, value)) in members.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_string(out, name);
            out.push(b':');
            out.extend_from_slice(value);
        }
        out.push(b'}');
        Ok(())
    }

    fn array(&mut self, out: &mut Vec<u8>, depth: usize) -> Result<(), NotCanonical> {
        self.expect(b'[')?;
        out.push(b'[');
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.pos += 1;
        } else {
            loop {
                self.skip_whitespace();
                self.value(out, depth + 1)?;
                self.skip_whitespace();
                match self.next()? {
                    b',' => out.push(b','),
                    b']' => break,
                    _ => return Err(NotCanonical::Syntax),
                }
            }
        }
        out.push(b']');
        Ok(())
    }

    /// A string literal, unescaped.
    fn string(&mut self) -> Result<String, NotCanonical> {
        self.expect(b'"')?;
        let mut bytes = Vec::new();
        loop {
            match self.next()? {
                b'"' => break,
                b'\\' => {
                    let ch = match self.next()? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => return Err(NotCanonical::Syntax),
                    };
                    let mut buf = [0; 4];
                    bytes.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                byte if byte < 0x20 => return Err(NotCanonical::Syntax),
                byte => bytes.push(byte),
            }
        }
        String::from_utf8(bytes).map_err(|_| NotCanonical::Syntax)
    }

    /// `\uXXXX`, with surrogate pairs joined. A lone surrogate has no UTF-8 form, so
    /// such a body is hashed raw.
    fn unicode_escape(&mut self) -> Result<char, NotCanonical> {
        let first = self.hex4()?;
        let code = if (0xD800..0xDC00).contains(&first) {
            self.expect(b'\\')?;
            self.expect(b'u')?;
            let second = self.hex4()?;
            if !(0xDC00..0xE000).contains(&second) {
                return Err(NotCanonical::Syntax);
            }
            0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
        } else {
            first
        };
        char::from_u32(code).ok_or(NotCanonical::Syntax)
    }

    fn hex4(&mut self) -> Result<u32, NotCanonical> {
        let mut value = 0;
        for _ in 0..4 {
            let digit = char::from(self.next()?)
                .to_digit(16)
                .ok_or(NotCanonical::Syntax)?;
            value = value * 16 + digit;
        }
        Ok(value)
    }

    fn number(&mut self, out: &mut Vec<u8>) -> Result<(), NotCanonical> {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let mut digits: Vec<u8> = Vec::new();
        let int_digits = self.digit_run(&mut digits);
        if int_digits == 0 || (int_digits > 1 && digits[0] == b'0') {
            return Err(NotCanonical::Syntax);
        }
        let mut exponent: i64 = 0;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            let frac_digits = self.digit_run(&mut digits);
            if frac_digits == 0 {
                return Err(NotCanonical::Syntax);
            }
            exponent -= frac_digits as i64;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            let sign = match self.peek() {
                Some(b'-') => {
                    self.pos += 1;
                    -1
                }
                Some(b'+') => {
                    self.pos += 1;
                    1
                }
                _ => 1,
            };
            let mut exp_digits = Vec::new();
            let count = self.digit_run(&mut exp_digits);
            // Eighteen digits fit an i64 with room for the adjustments below; a
            // longer exponent is no number anyone means, so hash the body raw.
            let exp_text = std::str::from_utf8(&exp_digits).map_err(|_| NotCanonical::Syntax)?;
            let exp_text = exp_text.trim_start_matches('0');
            if count == 0 || exp_text.len() > 18 {
                return Err(NotCanonical::Syntax);
            }
            let value: i64 = if exp_text.is_empty() {
                0
            } else {
                exp_text.parse().map_err(|_| NotCanonical::Syntax)?
            };
            exponent += sign * value;
        }
        write_decimal(out, negative, &digits, exponent);
        Ok(())
    }

    fn digit_run(&mut self, digits: &mut Vec<u8>) -> usize {
        let start = self.pos;
        while let Some(byte @ b'0'..=b'9') = self.peek() {
            digits.push(byte);
            self.pos += 1;
        }
        self.pos - start
    }
}

/// Writes `±digits × 10^exponent` in ECMAScript's layout, exactly.
fn write_decimal(out: &mut Vec<u8>, negative: bool, digits: &[u8], mut exponent: i64) {
    let first_nonzero = digits.iter().position(|&d| d != b'0');
    let Some(start) = first_nonzero else {
        out.push(b'0'); // 0, -0, 0.000, 0e10: all zero
        return;
    };
    let mut digits = &digits[start..];
    while let [rest @ .., b'0'] = digits {
        digits = rest;
        exponent += 1;
    }
    if negative {
        out.push(b'-');
    }
    let k = digits.len() as i64;
    let n = exponent + k; // value = 0.d1d2…dk × 10^n
    if k <= n && n <= 21 {
        out.extend_from_slice(digits);
        out.extend(std::iter::repeat_n(b'0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        let (int, frac) = digits.split_at(n as usize);
        out.extend_from_slice(int);
        out.push(b'.');
        out.extend_from_slice(frac);
    } else if -6 < n && n <= 0 {
        out.extend_from_slice(b"0.");
        out.extend(std::iter::repeat_n(b'0', (-n) as usize));
        out.extend_from_slice(digits);
    } else {
        out.push(digits[0]);
        if k > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        let e = n - 1;
        out.extend_from_slice(format!("e{}{}", if e >= 0 { "+" } else { "-" }, e.abs()).as_bytes());
    }
}

/// RFC 8785 §3.2.2.2: `"` and `\` escaped, the short escapes for b f n r t, other
/// control characters as lower-case `\u00xx`, everything else as UTF-8.
fn write_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for ch in s.chars() {
        match ch {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            c if (c as u32) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes());
            }
            c => {
                let mut buf = [0; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}
