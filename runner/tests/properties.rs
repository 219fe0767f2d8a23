//! Property tests: the masker under any chunking never lets a secret through and masks as it
//! would the whole text; the workflow reader takes any text without panicking.

use knotless_run::mask::Masker;
use knotless_run::workflow;
use proptest::prelude::*;

/// Secrets from a small alphabet, so that they overlap, prefix and contain one another. No
/// `*`: a secret made of the mask's own character would show in any masked text.
fn secrets() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec("[abc]{1,6}", 1..5)
}

/// Text made of the secrets and bits of them, with other bytes between.
fn text(secrets: Vec<String>) -> impl Strategy<Value = (Vec<String>, Vec<u8>)> {
    let pieces = secrets.clone();
    let piece = prop_oneof![
        3 => prop::sample::select(pieces.clone()).prop_map(String::into_bytes),
        2 => prop::sample::select(pieces).prop_flat_map(|secret| {
            let length = secret.len();
            (0..length).prop_map(move |cut| secret.as_bytes()[..cut].to_vec())
        }),
        2 => "[abcx\n]{0,4}".prop_map(String::into_bytes),
    ];
    prop::collection::vec(piece, 0..40).prop_map(move |pieces| (secrets.clone(), pieces.concat()))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn no_secret_gets_through_however_the_output_is_cut(
        (secrets, text) in secrets().prop_flat_map(text),
        cuts in prop::collection::vec(0usize..200, 0..16),
    ) {
        let masker = Masker::new(&secrets).expect("masker");
        let mut cuts: Vec<usize> = cuts.iter().map(|cut| cut % (text.len() + 1)).collect();
        cuts.sort_unstable();
        cuts.push(text.len());
        let mut stream = masker.stream();
        let mut out = Vec::new();
        let mut from = 0;
        for cut in cuts {
            out.extend(stream.push(&text[from..cut.max(from)]));
            from = cut.max(from);
            // Never more held back than a secret could need.
            prop_assert!(stream.held() < masker.longest());
        }
        out.extend(stream.finish());
        for secret in &secrets {
            prop_assert!(!contains(&out, secret.as_bytes()), "{secret:?} got through: {:?}", String::from_utf8_lossy(&out));
        }
        prop_assert_eq!(out, masker.mask(&text));
    }

    #[test]
    fn the_workflow_reader_takes_any_text(text in workflow_like()) {
        // An error or a workflow, never a panic; an error names the file.
        if let Err(error) = workflow::parse("ci", ".knotless/workflows/ci.yml", &text) {
            prop_assert!(error.to_string().contains(".knotless/workflows/ci.yml"), "{error}");
        }
    }
}

/// Text close to a workflow: its keys, YAML punctuation, indentation and scalars.
fn workflow_like() -> impl Strategy<Value = String> {
    let token = prop::sample::select(vec![
        "steps:",
        "- name: a",
        "run: echo hi",
        "timeout:",
        "10m",
        "env:",
        "A: b",
        "secrets:",
        "[A]",
        "image:",
        "network:",
        "true",
        "yes",
        "\"true\"",
        "on:",
        "push:",
        "branches:",
        "[main]",
        "cache:",
        "outputs:",
        "uses:",
        "queue:",
        "first",
        "runners:",
        "- ",
        ":",
        "{",
        "}",
        "[",
        "]",
        "&a",
        "*a",
        "<<:",
        "|",
        ">",
        "#",
        "'",
        "\"",
        "\t",
        "  ",
        "\n",
        "\n  ",
        "\n    ",
        "~",
        "null",
        "0x1",
        "1e9",
        "-1",
        "\u{1b}[31m",
        "..",
    ]);
    prop::collection::vec(token, 0..60).prop_map(|tokens| tokens.concat())
}
