//! Property tests of canonical JSON (PROTOCOL §4): one request, however it is spelled,
//! has one fingerprint, and no input makes the canonicalizer panic.
//!
//! A generated JSON value is rendered many ways — members in any order, any
//! insignificant whitespace, strings escaped or not, numbers in any exact spelling —
//! and every rendering must canonicalize to the same bytes.

use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::canonical::{NotCanonical, canonicalize};
use super::{Fingerprint, FingerprintInput};

/// A JSON value as the generator builds it; objects never repeat a member name.
#[derive(Clone, Debug)]
enum Json {
    Null,
    Bool(bool),
    /// `mantissa × 10^exponent`, negated when `negative`; `mantissa ≥ 1`.
    Number {
        negative: bool,
        mantissa: u64,
        exponent: i16,
    },
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

fn json() -> impl Strategy<Value = Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        (any::<bool>(), 1..=u64::MAX, -20i16..=20).prop_map(|(negative, mantissa, exponent)| {
            Json::Number {
                negative,
                mantissa,
                exponent,
            }
        }),
        any::<String>().prop_map(Json::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Json::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..6)
                .prop_map(|members| Json::Object(members.into_iter().collect())),
        ]
    })
}

/// Chooses how a rendering spells things, from a seeded generator.
struct Spelling(StdRng);

impl Spelling {
    fn new(seed: u64) -> Self {
        Self(StdRng::seed_from_u64(seed))
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0.random_range(0..n)
    }

    fn whitespace(&mut self, out: &mut String) {
        for _ in 0..self.below(3) {
            out.push([' ', '\t', '\n', '\r'][self.below(4) as usize]);
        }
    }

    fn render(&mut self, value: &Json, out: &mut String) {
        self.whitespace(out);
        match value {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number {
                negative,
                mantissa,
                exponent,
            } => self.number(*negative, *mantissa, *exponent, out),
            Json::String(s) => self.string(s, out),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    self.render(item, out);
                }
                self.whitespace(out);
                out.push(']');
            }
            Json::Object(members) => {
                let mut order: Vec<usize> = (0..members.len()).collect();
                for i in (1..order.len()).rev() {
                    order.swap(i, self.below(i as u64 + 1) as usize);
                }
                out.push('{');
                for (n, &i) in order.iter().enumerate() {
                    if n > 0 {
                        out.push(',');
                    }
                    self.whitespace(out);
                    self.string(&members[i].0, out);
                    self.whitespace(out);
                    out.push(':');
                    self.render(&members[i].1, out);
                }
                self.whitespace(out);
                out.push('}');
            }
        }
        self.whitespace(out);
    }

    /// Some exact spelling of `±mantissa × 10^exponent`: extra trailing zeros, a
    /// decimal point anywhere the value allows, `e`/`E`, an explicit `+`.
    fn number(&mut self, negative: bool, mantissa: u64, exponent: i16, out: &mut String) {
        if negative {
            out.push('-');
        }
        let zeros = self.below(3) as usize;
        let digits = format!("{mantissa}{}", "0".repeat(zeros));
        let exponent = i64::from(exponent) - zeros as i64;
        // The decimal point goes after `point` digits; the rest is the exponent.
        let point = 1 + self.below(digits.len() as u64) as usize;
        let rest = exponent + (digits.len() - point) as i64;
        let (int, frac) = digits.split_at(point);
        match self.below(3) {
            // Plain decimal, when the exponent is small enough to spell out.
            0 if exponent < 0 && (-exponent) as usize <= digits.len() + 3 => {
                let shift = (-exponent) as usize;
                if shift < digits.len() {
                    let (int, frac) = digits.split_at(digits.len() - shift);
                    out.push_str(&format!("{int}.{frac}"));
                } else {
                    out.push_str(&format!("0.{}{digits}", "0".repeat(shift - digits.len())));
                }
            }
            0 if (0..=6).contains(&exponent) => {
                out.push_str(&format!("{digits}{}", "0".repeat(exponent as usize)));
            }
            _ => {
                out.push_str(int);
                if !frac.is_empty() {
                    out.push('.');
                    out.push_str(frac);
                }
                out.push(if self.below(2) == 0 { 'e' } else { 'E' });
                if rest >= 0 && self.below(2) == 0 {
                    out.push('+');
                }
                out.push_str(&rest.to_string());
            }
        }
    }

    /// `s` as a JSON string, each character literal or escaped at random.
    fn string(&mut self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            let must_escape = c == '"' || c == '\\' || c < ' ';
            match self.below(4) {
                0 | 1 if !must_escape => out.push(c),
                2 => match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '/' => out.push_str("\\/"),
                    '\u{8}' => out.push_str("\\b"),
                    '\u{c}' => out.push_str("\\f"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    _ => self.unicode_escape(c, out),
                },
                _ => self.unicode_escape(c, out),
            }
        }
        out.push('"');
    }

    fn unicode_escape(&mut self, c: char, out: &mut String) {
        let mut units = [0u16; 2];
        for unit in c.encode_utf16(&mut units) {
            if self.below(2) == 0 {
                out.push_str(&format!("\\u{unit:04x}"));
            } else {
                out.push_str(&format!("\\u{unit:04X}"));
            }
        }
    }
}

fn spell(value: &Json, seed: u64) -> String {
    let mut out = String::new();
    Spelling::new(seed).render(value, &mut out);
    out
}

fn fingerprint(content_type: &str, body: &[u8]) -> Fingerprint {
    Fingerprint::of(FingerprintInput {
        method: "POST",
        path: "/orders",
        query: "",
        content_type: Some(content_type),
        headers: &[],
        body,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_spelling_of_a_value_has_one_canonical_form(
        value in json(),
        first in any::<u64>(),
        second in any::<u64>(),
    ) {
        let a = spell(&value, first);
        let b = spell(&value, second);
        let canonical = canonicalize(a.as_bytes());
        prop_assert!(canonical.is_ok(), "{a:?} did not canonicalize: {canonical:?}");
        prop_assert_eq!(&canonical, &canonicalize(b.as_bytes()), "{} vs {}", a, b);
        prop_assert_eq!(
            fingerprint("application/json", a.as_bytes()),
            fingerprint("application/json", b.as_bytes())
        );
    }

    #[test]
    fn canonical_form_is_utf8_and_a_fixed_point(value in json(), seed in any::<u64>()) {
        let canonical = canonicalize(spell(&value, seed).as_bytes()).unwrap();
        prop_assert!(std::str::from_utf8(&canonical).is_ok());
        prop_assert_eq!(canonicalize(&canonical), Ok(canonical.clone()));
    }

    #[test]
    fn numbers_hash_by_exact_value(
        negative in any::<bool>(),
        mantissa in 1..u64::MAX,
        exponent in -20i16..=20,
        first in any::<u64>(),
        second in any::<u64>(),
    ) {
        let number = |mantissa| Json::Number { negative, mantissa, exponent };
        let a = spell(&number(mantissa), first);
        let b = spell(&number(mantissa), second);
        prop_assert_eq!(
            fingerprint("application/json", a.as_bytes()),
            fingerprint("application/json", b.as_bytes()),
            "{} and {} are the same number", a, b
        );
        let next = spell(&number(mantissa + 1), second);
        prop_assert_ne!(
            fingerprint("application/json", a.as_bytes()),
            fingerprint("application/json", next.as_bytes()),
            "{} and {} are different numbers", a, next
        );
    }

    #[test]
    fn invalid_utf8_inside_a_string_is_not_json(
        value in json(),
        seed in any::<u64>(),
        bad in prop_oneof![
            Just(&b"\xc3\x28"[..]),     // a lead byte without its continuation
            Just(&b"\xc0\xaf"[..]),     // overlong '/'
            Just(&b"\xed\xa0\x80"[..]), // a UTF-16 surrogate encoded as UTF-8
            Just(&b"\xff"[..]),
            Just(&b"\x80"[..]),
        ],
    ) {
        let body = format!(r#"{{"x":"BAD","v":{}}}"#, spell(&value, seed)).into_bytes();
        let at = body.windows(3).position(|w| w == b"BAD").unwrap();
        let mut corrupted = body[..at].to_vec();
        corrupted.extend_from_slice(bad);
        corrupted.extend_from_slice(&body[at + 3..]);
        prop_assert_eq!(canonicalize(&corrupted), Err(NotCanonical::Syntax));
    }

    #[test]
    fn any_bytes_hash_without_panicking(body in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(canonical) = canonicalize(&body) {
            prop_assert_eq!(canonicalize(&canonical), Ok(canonical.clone()));
        }
        for content_type in ["application/json", "text/plain", "application/x+json"] {
            let _ = fingerprint(content_type, &body);
        }
    }

    #[test]
    fn json_like_bytes_hash_without_panicking(
        body in prop::collection::vec(
            prop::sample::select(b"{}[]\",:0123456789.eE+-\\u truefalsn\xc3\x80".to_vec()),
            0..256,
        ),
    ) {
        if let Ok(canonical) = canonicalize(&body) {
            prop_assert_eq!(canonicalize(&canonical), Ok(canonical.clone()));
        }
    }
}

/// The JSON pointer of the top-level member `name` (RFC 6901 escapes).
fn pointer_to(name: &str) -> super::JsonPointer {
    format!("/{}", name.replace('~', "~0").replace('/', "~1"))
        .parse()
        .unwrap()
}

fn selected(selection: &super::BodySelection, body: &str) -> Fingerprint {
    Fingerprint::of_selected(
        FingerprintInput {
            method: "POST",
            path: "/orders",
            query: "",
            content_type: Some("application/json"),
            headers: &[],
            body: body.as_bytes(),
        },
        selection,
    )
}

/// An object of `members` with `name` set to `value`, spelled by `seed`.
fn object_with(members: &[(String, Json)], name: &str, value: &Json, seed: u64) -> String {
    let mut members: Vec<(String, Json)> =
        members.iter().filter(|(n, _)| n != name).cloned().collect();
    members.push((name.to_owned(), value.clone()));
    spell(&Json::Object(members), seed)
}

fn differ(a: &Json, b: &Json) -> bool {
    canonicalize(spell(a, 0).as_bytes()) != canonicalize(spell(b, 0).as_bytes())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn an_excluded_member_never_changes_the_fingerprint_and_others_still_do(
        members in prop::collection::btree_map(any::<String>(), json(), 0..5),
        name in any::<String>(),
        (a, b) in (json(), json()),
        (first, second) in (any::<u64>(), any::<u64>()),
    ) {
        let members: Vec<_> = members.into_iter().collect();
        let selection = super::BodySelection::Except(vec![pointer_to(&name)]);
        let one = object_with(&members, &name, &a, first);
        let other = object_with(&members, &name, &b, second);
        prop_assert_eq!(selected(&selection, &one), selected(&selection, &other), "{} vs {}", one, other);
        if differ(&a, &b) {
            prop_assert_ne!(selected(&super::BodySelection::Whole, &one), selected(&super::BodySelection::Whole, &other));
            // The same change under another name is still a change.
            let kept = format!("{name}-kept");
            let selection = super::BodySelection::Except(vec![pointer_to(&kept)]);
            prop_assert_ne!(
                selected(&selection, &object_with(&members, &name, &a, first)),
                selected(&selection, &object_with(&members, &name, &b, second))
            );
        }
    }

    #[test]
    fn excluding_what_is_absent_is_the_whole_body(value in json(), seed in any::<u64>(), name in any::<String>()) {
        let body = spell(&value, seed);
        let pointer = pointer_to(&format!("{name}\u{0}absent"));
        prop_assert_eq!(
            selected(&super::BodySelection::Except(vec![pointer]), &body),
            selected(&super::BodySelection::Whole, &body)
        );
    }

    #[test]
    fn only_the_selected_member_counts(
        members in prop::collection::btree_map(any::<String>(), json(), 1..5),
        (a, b) in (json(), json()),
        (first, second) in (any::<u64>(), any::<u64>()),
    ) {
        let members: Vec<_> = members.into_iter().collect();
        let (chosen, chosen_value) = members[0].clone();
        let selection = super::BodySelection::Only(vec![pointer_to(&chosen)]);
        // Any other member changes: same fingerprint.
        let other = format!("{chosen}-other");
        let one = object_with(&members, &other, &a, first);
        let two = object_with(&members, &other, &b, second);
        prop_assert_eq!(selected(&selection, &one), selected(&selection, &two), "{} vs {}", one, two);
        // The chosen member changes: another fingerprint.
        if differ(&chosen_value, &a) {
            prop_assert_ne!(
                selected(&selection, &one),
                selected(&selection, &object_with(&members, &chosen, &a, second))
            );
        }
    }
}

/// A scalar: what a leaf changes to.
fn scalar() -> impl Strategy<Value = Json> {
    prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        (any::<bool>(), 1..=u64::MAX, -5i16..=5).prop_map(|(negative, mantissa, exponent)| {
            Json::Number {
                negative,
                mantissa,
                exponent,
            }
        }),
        any::<String>().prop_map(Json::String),
    ]
}

fn field_digests(body: &str) -> super::FieldDigests {
    super::FieldDigests::of_json(body.as_bytes(), &[9; 32]).expect("a JSON body")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The per-field digests read the canonical form: a respelling differs in
    /// no field.
    #[test]
    fn a_respelled_document_differs_in_no_field(
        value in json(),
        (first, second) in (any::<u64>(), any::<u64>()),
    ) {
        let (a, b) = (spell(&value, first), spell(&value, second));
        let (one, other) = (field_digests(&a), field_digests(&b));
        prop_assert_eq!(&one, &other, "{} vs {}", a, b);
        let differing = one.differing(&other);
        prop_assert!(differing.pointers.is_empty(), "{:?}", differing);
        prop_assert_eq!(differing.complete, one.is_complete());
    }

    /// One leaf changed, anywhere in the first levels: exactly its pointer.
    #[test]
    fn one_changed_leaf_is_exactly_its_pointer(
        members in prop::collection::btree_map("[a-z~/é]{1,6}", json(), 0..5),
        outer in "[a-z~/]{1,6}",
        inner in "[a-z~/]{1,6}",
        nested in any::<bool>(),
        (a, b) in (scalar(), scalar()),
        (first, second) in (any::<u64>(), any::<u64>()),
    ) {
        prop_assume!(differ(&a, &b));
        let members: Vec<_> = members.into_iter().filter(|(name, _)| *name != outer).collect();
        let escape = |name: &str| name.replace('~', "~0").replace('/', "~1");
        let (pointer, with) = if nested {
            let wrap = |leaf: &Json| Json::Object(vec![(inner.clone(), leaf.clone())]);
            (format!("/{}/{}", escape(&outer), escape(&inner)), (wrap(&a), wrap(&b)))
        } else {
            (format!("/{}", escape(&outer)), (a.clone(), b.clone()))
        };
        let one = object_with(&members, &outer, &with.0, first);
        let other = object_with(&members, &outer, &with.1, second);
        let (one_fields, other_fields) = (field_digests(&one), field_digests(&other));
        let differing = one_fields.differing(&other_fields);
        if one_fields.is_complete() && other_fields.is_complete() {
            prop_assert_eq!(&differing.pointers, &vec![pointer], "{} vs {}", one, other);
            prop_assert!(differing.complete);
        } else {
            // Too many fields to keep them all: whatever is named is that leaf,
            // and the answer says it may not be all.
            prop_assert!(differing.pointers.iter().all(|p| *p == pointer), "{:?}", differing);
            prop_assert!(!differing.complete);
        }
        // Digests round-trip through a store's encoding.
        let decoded = super::FieldDigests::decode(&one_fields.encode());
        prop_assert_eq!(decoded.as_ref(), Ok(&one_fields));
    }
}
