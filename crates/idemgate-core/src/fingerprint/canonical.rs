//! Canonical JSON for fingerprints: RFC 8785 (JCS) layout with exact decimal numbers.
//!
//! JCS sorts members by UTF-16 code units, drops insignificant whitespace and escapes
//! strings one way; we do all of that. JCS also prints numbers the way ECMAScript
//! prints an IEEE-754 double, which would make `9007199254740993` equal
//! `9007199254740992`. PROTOCOL §4 forbids that, so numbers keep their exact decimal
//! value and use the ECMAScript *layout* (`1e+30`, `0.002`, `4.5`) for it. The two
//! agree on every number a double holds exactly in its shortest form.
//!
//! A hand-written parser rather than `serde_json`: serde_json keeps exact number text
//! only with the `arbitrary_precision` feature, which would switch on for every crate
//! in a user's build, and it silently keeps the last of duplicate member names, which
//! PROTOCOL §4 hashes as raw bytes instead.

use std::ops::Range;

/// Why a body has no canonical form (it is then fingerprinted as raw bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotCanonical {
    /// Not JSON, or not UTF-8.
    Syntax,
    /// An object names the same member twice.
    DuplicateMember,
    /// Nested deeper than [`MAX_DEPTH`].
    TooDeep,
}

/// Nesting deeper than this is not canonicalized (it would only serve to exhaust the
/// stack); such bodies are hashed raw.
pub(crate) const MAX_DEPTH: usize = 128;

/// The canonical form of a JSON text.
pub(crate) fn canonicalize(input: &[u8]) -> Result<Vec<u8>, NotCanonical> {
    let mut parser = Parser {
        input,
        pos: 0,
        buffers: Vec::new(),
        digits: Vec::new(),
    };
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
    /// Spare buffers for objects' members and string values, reused so that a
    /// document costs a few allocations rather than several per value.
    buffers: Vec<Vec<u8>>,
    /// A number's digits (numbers do not nest, so one buffer serves all).
    digits: Vec<u8>,
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

    fn buffer(&mut self) -> Vec<u8> {
        self.buffers.pop().unwrap_or_default()
    }

    fn give_back(&mut self, mut buffer: Vec<u8>) {
        buffer.clear();
        self.buffers.push(buffer);
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
                let mut text = self.buffer();
                let parsed = self.string(&mut text);
                if parsed.is_ok() {
                    write_string(out, &text);
                }
                self.give_back(text);
                parsed
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
        // Names (unescaped) and canonical values go to one buffer; members are
        // ranges into it, sorted, then written out in order.
        let mut buffer = self.buffer();
        let mut members = Vec::new();
        let parsed = self.members(&mut buffer, &mut members, depth);
        if parsed.is_ok() {
            // RFC 8785 §3.2.3: order by the UTF-16 code units of the unescaped names.
            members.sort_by(|(a, _), (b, _)| utf16_cmp(&buffer[a.clone()], &buffer[b.clone()]));
            if members
                .windows(2)
                .any(|pair| buffer[pair[0].0.clone()] == buffer[pair[1].0.clone()])
            {
                self.give_back(buffer);
                return Err(NotCanonical::DuplicateMember);
            }
            out.push(b'{');
            for (i, (name, value)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(out, &buffer[name.clone()]);
                out.push(b':');
                out.extend_from_slice(&buffer[value.clone()]);
            }
            out.push(b'}');
        }
        self.give_back(buffer);
        parsed
    }

    /// An object's members into `buffer`, as (name, value) ranges of it.
    fn members(
        &mut self,
        buffer: &mut Vec<u8>,
        members: &mut Vec<(Range<usize>, Range<usize>)>,
        depth: usize,
    ) -> Result<(), NotCanonical> {
        self.expect(b'{')?;
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            self.skip_whitespace();
            if self.peek() != Some(b'"') {
                return Err(NotCanonical::Syntax);
            }
            let name_start = buffer.len();
            self.string(buffer)?;
            let name = name_start..buffer.len();
            self.skip_whitespace();
            self.expect(b':')?;
            self.skip_whitespace();
            let value_start = buffer.len();
            self.value(buffer, depth + 1)?;
            members.push((name, value_start..buffer.len()));
            self.skip_whitespace();
            match self.next()? {
                b',' => continue,
                b'}' => return Ok(()),
                _ => return Err(NotCanonical::Syntax),
            }
        }
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

    /// A string literal, unescaped, appended to `out` (checked to be UTF-8).
    fn string(&mut self, out: &mut Vec<u8>) -> Result<(), NotCanonical> {
        self.expect(b'"')?;
        let start = out.len();
        loop {
            // Copy the run up to the next quote, backslash or control byte at once.
            let rest = &self.input[self.pos..];
            let run = rest
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
                .ok_or(NotCanonical::Syntax)?;
            out.extend_from_slice(&rest[..run]);
            self.pos += run;
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
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                _ => return Err(NotCanonical::Syntax), // a control byte
            }
        }
        std::str::from_utf8(&out[start..]).map_err(|_| NotCanonical::Syntax)?;
        Ok(())
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
        let mut digits = std::mem::take(&mut self.digits);
        digits.clear();
        let parsed = self.number_parts(&mut digits);
        if let Ok(exponent) = parsed {
            write_decimal(out, negative, &digits, exponent);
        }
        self.digits = digits;
        parsed.map(drop)
    }

    /// A number's digits into `digits` (integer then fraction part); returns the
    /// decimal exponent that applies to them.
    fn number_parts(&mut self, digits: &mut Vec<u8>) -> Result<i64, NotCanonical> {
        let int_digits = self.digit_run(digits);
        if int_digits == 0 || (int_digits > 1 && digits[0] == b'0') {
            return Err(NotCanonical::Syntax);
        }
        let mut exponent: i64 = 0;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            let frac_digits = self.digit_run(digits);
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
            let start = self.pos;
            while let Some(b'0'..=b'9') = self.peek() {
                self.pos += 1;
            }
            let exp_digits = &self.input[start..self.pos];
            // Eighteen digits fit an i64 with room for the adjustments below; a
            // longer exponent is no number anyone means, so hash the body raw.
            let significant = exp_digits
                .iter()
                .position(|&d| d != b'0')
                .map_or(&[][..], |first| &exp_digits[first..]);
            if exp_digits.is_empty() || significant.len() > 18 {
                return Err(NotCanonical::Syntax);
            }
            let value = significant
                .iter()
                .fold(0i64, |value, &d| value * 10 + i64::from(d - b'0'));
            exponent += sign * value;
        }
        Ok(exponent)
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
/// control characters as lower-case `\u00xx`, everything else as UTF-8. `s` is
/// UTF-8: every byte that needs an escape is ASCII, so runs of the others are
/// copied as they are.
pub(super) fn write_string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    let mut rest = s;
    while let Some(at) = rest
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
    {
        out.extend_from_slice(&rest[..at]);
        match rest[at] {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            control => out.extend_from_slice(format!("\\u{control:04x}").as_bytes()),
        }
        rest = &rest[at + 1..];
    }
    out.extend_from_slice(rest);
    out.push(b'"');
}

/// RFC 8785's member order: by UTF-16 code units. Below U+E000 (every UTF-8 byte
/// under 0xEE) that is the byte order; otherwise the names are compared as UTF-16.
fn utf16_cmp(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    if a.iter().chain(b).all(|&byte| byte < 0xEE) {
        return a.cmp(b);
    }
    // Both were checked to be UTF-8 when parsed.
    let utf16 = |bytes| {
        std::str::from_utf8(bytes)
            .unwrap_or_default()
            .encode_utf16()
    };
    utf16(a).cmp(utf16(b))
}

#[cfg(test)]
#[path = "canonical_reference.rs"]
mod reference;

#[cfg(test)]
mod tests {
    use super::*;

    /// The optimized canonicalizer answers exactly what the reference one does, on
    /// every input of the tests below and on random documents full of the cases
    /// that matter: escapes, non-ASCII and astral names, numbers in every layout,
    /// duplicates, nesting, and broken JSON.
    #[test]
    fn agrees_with_the_reference_byte_for_byte() {
        let mut corpus: Vec<Vec<u8>> = [
            r#"{"items":[{"id":42,"quantity":1}],"currency":"RUB","amount":1500}"#,
            r#"{"\u20ac":1,"\r":2,"\ufb33":3,"1":4,"\ud83d\ude00":5,"\u0080":6,"\u00f6":7}"#,
            r#"{"a":1,"\u0061":2}"#,
            "\"\\u001f\"",
            "\"a\u{1}\"",
            "[1e400, -0.0e5, 15e-1, 0.0000001, 123456789012345678901234567890]",
            "1e9999999999999999999",
            "1e000000000000000000000000005",
            "\"\\ud800\"",
            "{\"\u{e000}\":1,\"\u{ffff}\":2,\"\u{10000}\":3,\"\u{ee}\":4}",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
        corpus.push(vec![b'"', 0xc3, b'\\', b'u', b'0', b'0', b'4', b'1', b'"']);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut random = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..3000 {
            let mut doc = String::new();
            random_value(&mut doc, &mut random, 0);
            // Now and then, break it.
            if random(8) == 0 && !doc.is_empty() {
                let cut = random(doc.len() as u64) as usize;
                let cut = (0..=cut)
                    .rev()
                    .find(|&i| doc.is_char_boundary(i))
                    .unwrap_or(0);
                doc.truncate(cut);
            }
            corpus.push(doc.into_bytes());
        }
        for input in corpus {
            assert_eq!(
                canonicalize(&input),
                reference::canonicalize(&input),
                "input {:?}",
                String::from_utf8_lossy(&input)
            );
        }
    }

    fn random_value(out: &mut String, random: &mut impl FnMut(u64) -> u64, depth: usize) {
        const NAMES: [&str; 12] = [
            "a",
            "b",
            "id",
            "é",
            "\\u00e9",
            "€",
            "\\u20ac",
            "😀",
            "\\ud83d\\ude00",
            "\u{ff21}",
            "\\\"q",
            "a\\nb",
        ];
        const STRINGS: [&str; 8] = [
            "",
            "plain",
            "\\t\\u0001\\/",
            "caf\\u00e9 \\\"x\\\"",
            "😀€",
            "\\u001F",
            "\\b\\f\\r",
            "a/b\\\\c",
        ];
        const NUMBERS: [&str; 12] = [
            "0",
            "-0",
            "1.50",
            "15e-1",
            "1E+3",
            "0.000001",
            "1e-7",
            "-12.3400e2",
            "9007199254740993",
            "1e21",
            "100e-2",
            "0e10",
        ];
        let space = |out: &mut String, random: &mut dyn FnMut(u64) -> u64| {
            if random(3) == 0 {
                out.push_str([" ", "\n", "\t ", "\r\n"][random(4) as usize]);
            }
        };
        match if depth > 4 { random(3) + 2 } else { random(6) } {
            0 => {
                out.push('{');
                let members = random(5);
                for i in 0..members {
                    if i > 0 {
                        out.push(',');
                    }
                    space(out, random);
                    out.push('"');
                    out.push_str(NAMES[random(NAMES.len() as u64) as usize]);
                    out.push('"');
                    space(out, random);
                    out.push(':');
                    random_value(out, random, depth + 1);
                }
                out.push('}');
            }
            1 => {
                out.push('[');
                for i in 0..random(5) {
                    if i > 0 {
                        out.push(',');
                    }
                    space(out, random);
                    random_value(out, random, depth + 1);
                }
                out.push(']');
            }
            2 => {
                out.push('"');
                out.push_str(STRINGS[random(STRINGS.len() as u64) as usize]);
                out.push('"');
            }
            3 | 4 => out.push_str(NUMBERS[random(NUMBERS.len() as u64) as usize]),
            _ => out.push_str(["true", "false", "null"][random(3) as usize]),
        }
    }

    fn canon(input: &str) -> String {
        String::from_utf8(canonicalize(input.as_bytes()).unwrap()).unwrap()
    }

    /// RFC 8785 §3.2.2 "Sample Canonicalization".
    #[test]
    fn rfc8785_sample() {
        let input = r#"{
          "numbers": [1E30, 4.50, 2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        assert_eq!(
            canon(input),
            r#"{"literals":[null,true,false],"numbers":[1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    /// RFC 8785 §3.2.3 "Sorting of Object Properties": UTF-16 code unit order.
    #[test]
    fn rfc8785_sorting() {
        let input = r#"{
          "\u20ac": "Euro Sign",
          "\r": "Carriage Return",
          "\ufb33": "Hebrew Letter Dalet With Dagesh",
          "1": "One",
          "\ud83d\ude00": "Emoji: Grinning Face",
          "\u0080": "Control",
          "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        let expected = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"דּ\":\"Hebrew Letter Dalet With Dagesh\"}";
        assert_eq!(canon(input), expected);
    }

    /// RFC 8785 Appendix B numbers that a double holds exactly: our exact-decimal
    /// output matches JCS on them.
    #[test]
    fn rfc8785_number_layout() {
        for (input, expected) in [
            ("0", "0"),
            ("-0", "0"),
            ("1", "1"),
            ("-1", "-1"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("123456789012345680000", "123456789012345680000"),
            ("0.000001", "0.000001"),
            ("0.0000001", "1e-7"),
            ("9007199254740991", "9007199254740991"),
            ("-9007199254740991", "-9007199254740991"),
            ("295147905179352830000", "295147905179352830000"),
            ("1.5e-7", "1.5e-7"),
            ("4.35", "4.35"),
            ("0.1", "0.1"),
        ] {
            assert_eq!(canon(input), expected, "input {input}");
        }
    }

    /// PROTOCOL §4: numbers compare by exact decimal value, never through f64.
    #[test]
    fn numbers_are_exact_decimals() {
        assert_eq!(canon("1.50"), canon("1.5"));
        assert_eq!(canon("15e-1"), canon("1.5"));
        assert_eq!(canon("1500"), canon("1.5e3"));
        assert_eq!(canon("1500"), canon("1.5E+3"));
        assert_eq!(canon("0.0"), canon("0"));
        assert_eq!(canon("-0.0e5"), canon("0"));
        assert_ne!(canon("9007199254740993"), canon("9007199254740992"));
        assert_ne!(canon("0.1"), canon("0.10000000000000001"));
        assert_ne!(canon("1"), canon("-1"));
        assert_eq!(canon("333333333.33333329"), "333333333.33333329");
        assert_eq!(canon("1e400"), "1e+400", "beyond f64 range is still exact");
        assert_eq!(
            canon("123456789012345678901234567890"),
            "1.2345678901234567890123456789e+29"
        );
    }

    #[test]
    fn whitespace_and_member_order_do_not_matter() {
        let a = canon(r#"{"items":[{"id":42,"quantity":1}],"currency":"RUB","amount":1500}"#);
        let b = canon(
            "{ \"amount\" : 1500 ,\n \"currency\":\"RUB\", \"items\" : [ { \"quantity\":1, \"id\":42 } ] }",
        );
        assert_eq!(a, b);
        assert_eq!(
            a,
            r#"{"amount":1500,"currency":"RUB","items":[{"id":42,"quantity":1}]}"#
        );
    }

    #[test]
    fn string_escapes_are_canonical() {
        assert_eq!(canon(r#""\u0041\/""#), canon(r#""A/""#));
        assert_eq!(canon(r#""\u00e9""#), "\"é\"");
        assert_eq!(canon("\"\\u001f\""), "\"\\u001f\"");
    }

    #[test]
    fn refuses_what_has_no_canonical_form() {
        assert_eq!(
            canonicalize(br#"{"a":1,"a":2}"#),
            Err(NotCanonical::DuplicateMember)
        );
        assert_eq!(
            canonicalize(br#"{"a":1,"\u0061":2}"#),
            Err(NotCanonical::DuplicateMember)
        );
        for bad in [
            "",
            "{",
            "[1,]",
            "{\"a\"}",
            "01",
            "1.",
            ".5",
            "1e",
            "+1",
            "tru",
            "\"a",
            "[1] x",
            "\"\\ud800\"",
            "\"\\x\"",
            "\"a\u{1}\"",
            "NaN",
            "1e9999999999999999999",
        ] {
            assert_eq!(
                canonicalize(bad.as_bytes()),
                Err(NotCanonical::Syntax),
                "input {bad:?}"
            );
        }
        assert_eq!(canonicalize(&[b'"', 0xff, b'"']), Err(NotCanonical::Syntax));
        let deep = "[".repeat(MAX_DEPTH + 2) + &"]".repeat(MAX_DEPTH + 2);
        assert_eq!(canonicalize(deep.as_bytes()), Err(NotCanonical::TooDeep));
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(canonicalize(ok.as_bytes()).is_ok());
    }
}
