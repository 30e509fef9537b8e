//! Property tests of path canonicalization (PROTOCOL §3): every spelling of a path
//! becomes one, the result is a fixed point with none of the spellings
//! canonicalization removes, the strict policy only ever refuses (never reads a
//! path another way), and the normalization of the layer's scope never fails.

use idemgate_core::path::{
    AboveRoot, ControlOrNonAscii, EncodedDotSegment, EncodedSlash, PathFold, PathParameters,
    PathPolicy, canonicalize, normalize_path,
};
use idemgate_testkit::strategies::{path_spellings, raw_path};
use proptest::prelude::*;

fn any_policy() -> impl Strategy<Value = PathPolicy> {
    (
        prop::sample::select(vec![
            EncodedSlash::Refuse,
            EncodedSlash::Keep,
            EncodedSlash::Decode,
        ]),
        prop::sample::select(vec![EncodedDotSegment::Refuse, EncodedDotSegment::Resolve]),
        prop::sample::select(vec![
            PathParameters::Refuse,
            PathParameters::Keep,
            PathParameters::Strip,
        ]),
        prop::sample::select(vec![ControlOrNonAscii::Refuse, ControlOrNonAscii::Encode]),
        prop::sample::select(vec![AboveRoot::Refuse, AboveRoot::Clamp]),
    )
        .prop_map(
            |(
                encoded_slash,
                encoded_dot_segment,
                path_parameters,
                control_or_non_ascii,
                above_root,
            )| {
                PathPolicy {
                    encoded_slash,
                    encoded_dot_segment,
                    path_parameters,
                    control_or_non_ascii,
                    above_root,
                }
            },
        )
}

/// What a canonical path never holds: a missing leading `/`, an empty segment
/// (`//` or a trailing `/`), a dot segment, a lower-case or needless escape, a
/// byte a request target may not carry raw.
fn assert_canonical(path: &str) -> Result<(), TestCaseError> {
    prop_assert!(path.starts_with('/'), "{path}");
    if path != "/" {
        for segment in path[1..].split('/') {
            prop_assert!(!segment.is_empty(), "empty segment in {path}");
            prop_assert!(segment != "." && segment != "..", "dot segment in {path}");
        }
    }
    let bytes = path.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = &path[i + 1..i + 3];
            prop_assert!(
                hex.bytes()
                    .all(|h| h.is_ascii_digit() || (b'A'..=b'F').contains(&h)),
                "escape {hex} in {path}"
            );
            let decoded = u8::from_str_radix(hex, 16).unwrap();
            prop_assert!(
                !(decoded.is_ascii_alphanumeric() || b"-._~".contains(&decoded)),
                "needless escape %{hex} in {path}"
            );
            i += 3;
            continue;
        }
        prop_assert!(
            b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/".contains(&b),
            "raw {:?} in {path}",
            char::from(b)
        );
        i += 1;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn every_spelling_of_a_path_is_one_path((canonical, spellings) in path_spellings()) {
        prop_assert_eq!(
            canonicalize(&canonical, &PathPolicy::STRICT).map(|p| p.into_string()),
            Ok(canonical.clone())
        );
        for spelling in &spellings {
            let path = canonicalize(spelling, &PathPolicy::STRICT);
            prop_assert_eq!(
                path.map(|p| p.into_string()),
                Ok(canonical.clone()),
                "spelled {}",
                spelling
            );
            prop_assert_eq!(normalize_path(spelling), canonical.clone());
        }
    }

    #[test]
    fn canonical_paths_are_fixed_points_under_every_policy(raw in raw_path(), policy in any_policy()) {
        if let Ok(path) = canonicalize(&raw, &policy) {
            assert_canonical(path.as_str())?;
            let again = canonicalize(path.as_str(), &policy).map(|p| p.into_string());
            prop_assert_eq!(again, Ok(path.as_str().to_owned()), "from {:?}", raw);
            let forwarded = canonicalize(&path.forwarded(), &policy).map(|p| p.into_string());
            prop_assert_eq!(forwarded, Ok(path.as_str().to_owned()));
        }
    }

    #[test]
    fn the_scope_normalization_never_fails_and_is_idempotent(raw in raw_path()) {
        let once = normalize_path(&raw);
        assert_canonical(&once)?;
        prop_assert_eq!(normalize_path(&once), once.clone());
    }

    #[test]
    fn strict_refuses_but_never_reads_a_path_another_way(raw in raw_path(), policy in any_policy()) {
        // Every policy is the strict one with some classes allowed: what the
        // strict one accepts, each of them reads the same.
        if let Ok(strict) = canonicalize(&raw, &PathPolicy::STRICT) {
            let other = canonicalize(&raw, &policy);
            prop_assert_eq!(other, Ok(strict));
        }
    }

    #[test]
    fn folds_are_canonical_and_idempotent(
        raw in raw_path(),
        case in any::<bool>(),
        suffix in any::<bool>(),
    ) {
        let fold = PathFold::NONE.with_case_insensitive(case).with_format_suffix(suffix);
        let path = normalize_path(&raw);
        let folded = fold.apply(&path).into_owned();
        assert_canonical(&folded)?;
        prop_assert_eq!(fold.apply(&folded).into_owned(), folded.clone());
        prop_assert_eq!(normalize_path(&folded), folded);
    }
}
