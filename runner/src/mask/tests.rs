use super::sampled::{GRAM, PLACES_COMPARED, SAMPLED_SHORTEST, SHARED_LEAST};
use super::*;

fn masker(values: &[&str]) -> Masker {
    Masker::new(values).expect("masker builds")
}

/// Masks `text` whole and checks the result.
fn check(values: &[&str], text: &str, expected: &str) {
    let masked = masker(values).mask(text.as_bytes());
    assert_eq!(String::from_utf8_lossy(&masked), expected, "{values:?} {text:?}");
}

/// Streams `text` cut at `cuts` (ascending positions) and returns the output.
fn stream_cut(masker: &Masker, text: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut stream = masker.stream();
    let mut out = Vec::new();
    let mut start = 0;
    for &cut in cuts.iter().chain([text.len()].iter()) {
        out.extend(stream.push(&text[start..cut]));
        assert!(stream.held() < masker.longest().max(1), "carry too long");
        start = cut;
    }
    out.extend(stream.finish());
    out
}

/// A small fixed-seed generator (xorshift64), so the random chunkings repeat.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }
}

#[test]
fn masks_whole_buffers() {
    check(&["hunter2"], "password: hunter2\n", "password: ***\n");
    check(&["abc", "abcdef"], "xabcdefy abcx", "x***y ***x");
    check(&["abc", "bcd"], "abcd", "***d");
    check(&["aa"], "aaaaa", "******a");
    check(&["s3cr3t"], "no secret here", "no secret here");
    check(&[], "nothing to mask", "nothing to mask");
    check(&["", "x"], "axbx", "a***b***");
    check(&["tok"], "toktok", "******");
    check(&["ab", "b"], "abb", "******");
}

#[test]
fn empty_masker_passes_everything_through() {
    let masker = Masker::new(Vec::<&str>::new()).expect("masker builds");
    assert!(masker.is_empty());
    assert!(Masker::new([""]).expect("masker builds").is_empty());
    let mut stream = masker.stream();
    assert_eq!(stream.push(b"abc"), b"abc");
    assert_eq!(stream.finish(), b"");
}

#[test]
fn debug_never_shows_values() {
    let text = format!("{:?}", masker(&["hunter2"]));
    assert!(!text.contains("hunter2"), "{text}");
}

#[test]
fn a_secret_split_byte_by_byte_is_masked() {
    let masker = masker(&["hunter2"]);
    let text = b"say hunter2 twice: hunter2!";
    let cuts: Vec<usize> = (1..text.len()).collect();
    assert_eq!(stream_cut(&masker, text, &cuts), b"say *** twice: ***!");
}

#[test]
fn overlapping_secrets_mask_the_longer_across_chunks() {
    let masker = masker(&["abc", "abcdef"]);
    let mut stream = masker.stream();
    assert_eq!(stream.push(b"x abc"), b"x ");
    assert_eq!(stream.push(b"de"), b"");
    assert_eq!(stream.push(b"f y"), b"*** y");
    assert_eq!(stream.finish(), b"");
    // "abc" followed by something that is not "def" is masked as soon as that is known.
    let mut stream = masker.stream();
    assert_eq!(stream.push(b"abc"), b"");
    assert_eq!(stream.push(b"dx"), b"***dx");
}

#[test]
fn a_possible_prefix_at_the_end_waits_for_finish() {
    let masker = masker(&["hunter2"]);
    let mut stream = masker.stream();
    assert_eq!(stream.push(b"login: hunt"), b"login: ");
    assert_eq!(stream.held(), 4);
    assert_eq!(stream.finish(), b"hunt");
    let mut stream = masker.stream();
    assert_eq!(stream.push(b"login: hunt"), b"login: ");
    assert_eq!(stream.push(b"er2"), b"***");
}

#[test]
fn bytes_that_cannot_begin_a_secret_are_emitted_at_once() {
    let masker = masker(&["hunter2"]);
    let mut stream = masker.stream();
    assert_eq!(stream.push(b"progress 10%"), b"progress 10%");
    assert_eq!(stream.held(), 0);
}

#[test]
fn every_split_matches_masking_whole() {
    let values = ["abc", "abcdef", "cde", "zz", "secret-token-1234", "a"];
    let masker = masker(&values);
    let text: &[u8] = b"aabcdefzzz abcde secret-token-123 secret-token-1234abcabcdefabc zzz";
    let whole = masker.mask(text);
    // Every single split point, and every pair of split points.
    for first in 0..=text.len() {
        assert_eq!(stream_cut(&masker, text, &[first]), whole, "cut at {first}");
        for second in first..=text.len() {
            assert_eq!(stream_cut(&masker, text, &[first, second]), whole, "cuts {first} {second}");
        }
    }
}

#[test]
fn random_chunkings_of_random_texts_match_masking_whole() {
    let mut rng = Rng(0x5eed_cafe_f00d_d00d);
    let alphabet = b"abcz-";
    for _ in 0..500 {
        let values: Vec<Vec<u8>> = (0..1 + rng.below(4))
            .map(|_| (0..1 + rng.below(5)).map(|_| alphabet[rng.below(alphabet.len())]).collect())
            .collect();
        let masker = Masker::new(&values).expect("masker builds");
        let text: Vec<u8> = (0..rng.below(60)).map(|_| alphabet[rng.below(alphabet.len())]).collect();
        let whole = masker.mask(&text);
        for _ in 0..20 {
            let cuts = random_cuts(&mut rng, text.len());
            assert_eq!(stream_cut(&masker, &text, &cuts), whole, "{values:?} {text:?} {cuts:?}");
        }
    }
}

/// Up to seven places to cut a text of `length` bytes, in order.
fn random_cuts(rng: &mut Rng, length: usize) -> Vec<usize> {
    let mut cuts: Vec<usize> = (0..rng.below(8)).map(|_| rng.below(length + 1)).collect();
    cuts.sort();
    cuts
}

/// Masking `text` whole, and as a stream in five random chunkings, gives what [`naive`]
/// gives.
fn masks_as_naive(masker: &Masker, text: &[u8], rng: &mut Rng) {
    let values = &masker.inner.values;
    let expected = naive(values, text);
    assert_eq!(masker.mask(text), expected, "{values:?} {text:?}");
    for _ in 0..5 {
        let cuts = random_cuts(rng, text.len());
        assert_eq!(stream_cut(masker, text, &cuts), expected, "{values:?} {text:?} {cuts:?}");
    }
}

/// Leftmost-longest masking the slow way: at each position, the longest value there.
fn naive(values: &[Vec<u8>], text: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < text.len() {
        let longest = values.iter().filter(|value| text[at..].starts_with(value)).map(Vec::len).max();
        match longest {
            Some(length) => {
                out.extend_from_slice(MASK);
                at += length;
            }
            None => {
                out.push(text[at]);
                at += 1;
            }
        }
    }
    out
}

#[test]
fn the_packed_searcher_and_the_automaton_both_mask_leftmost_longest() {
    let mut rng = Rng(0x0dd_ba11_5eed_0001);
    let alphabet = b"abcz-";
    for round in 0..400 {
        // Few values, values in several packed groups, and more than they take.
        let count = match round % 3 {
            0 => 1 + rng.below(6),
            1 => 60 + rng.below(120),
            _ => 257 + rng.below(40),
        };
        let values: Vec<Vec<u8>> =
            (0..count).map(|_| (0..1 + rng.below(6)).map(|_| alphabet[rng.below(alphabet.len())]).collect()).collect();
        let text: Vec<u8> = (0..rng.below(80)).map(|_| alphabet[rng.below(alphabet.len())]).collect();
        let masker = Masker::new(&values).expect("masker builds");
        let expected = naive(&masker.inner.values, &text);
        assert_eq!(masker.mask(&text), expected, "{values:?} {text:?}");
        let sorted = &masker.inner.values;
        let automaton = AhoCorasick::builder().match_kind(MatchKind::LeftmostLongest).build(sorted).expect("automaton");
        let inner = Inner {
            finder: Some(Finder::Automaton(automaton)),
            shared: None,
            sampler: None,
            values: sorted.clone(),
            longest: masker.longest(),
            beginnings: Beginnings::new(sorted),
        };
        let by_automaton = Masker { inner: Arc::new(inner) };
        assert_eq!(by_automaton.mask(&text), expected, "{values:?} {text:?}");
    }
}

#[test]
fn up_to_256_values_take_the_packed_searchers_and_more_the_automaton() {
    // Their first bytes differ (a to z), as random tokens' do.
    // Shorter than eight bytes, so that the text is searched whole.
    let values = |count: usize| {
        (0..count).map(|index| format!("{}{index:04}-t", char::from(b'a' + (index % 26) as u8))).collect::<Vec<_>>()
    };
    let packed = |masker: &Masker| matches!(masker.inner.finder, Some(Finder::Packed(_)));
    // The packed searcher needs SIMD instructions; without them every masker takes the automaton.
    if cfg!(target_arch = "x86_64") && std::arch::is_x86_feature_detected!("ssse3") {
        let masker = Masker::new(values(256)).expect("masker");
        assert!(packed(&masker));
        assert_eq!(masker.mask(b"a v0255-t and h0007-t."), b"a *** and ***.");
    }
    let many = Masker::new(values(257)).expect("masker");
    assert!(!packed(&many));
    assert_eq!(many.mask(b"a w0256-t and h0007-t."), b"a *** and ***.");
    // Values that all begin alike take the automaton, whose prefilter looks for that byte.
    let alike = Masker::new(["token-1", "token-2", "token-3", "token-4", "token-5"]).expect("masker");
    assert!(!packed(&alike));
}

#[test]
fn of_two_groups_matches_at_one_place_the_longer_wins_and_of_two_places_the_leftmost() {
    let group = |values: &[&str]| {
        packed::Config::new().match_kind(packed::MatchKind::LeftmostLongest).builder().extend(values).build()
    };
    let (Some(short), Some(long)) = (group(&["ab", "zz"]), group(&["abc", "bcd"])) else {
        return; // No SIMD search on this CPU: only the automaton is used.
    };
    let (Some(short_again), Some(long_again)) = (group(&["ab", "zz"]), group(&["abc", "bcd"])) else {
        return;
    };
    let values: Vec<Vec<u8>> = ["ab", "abc", "bcd", "zz"].iter().map(|value| value.as_bytes().to_vec()).collect();
    for groups in [vec![short, long], vec![long_again, short_again]] {
        let inner = Inner {
            finder: Some(Finder::Packed(groups)),
            shared: None,
            sampler: None,
            values: values.clone(),
            longest: 3,
            beginnings: Beginnings::new(&values),
        };
        let masker = Masker { inner: Arc::new(inner) };
        assert_eq!(masker.mask(b"x abc x abcd x zabcd"), b"x *** x ***d x z***d");
        assert_eq!(masker.mask(b"bcd ab"), b"*** ***");
    }
}

#[test]
fn sampled_masking_matches_leftmost_longest_whole_and_in_chunks() {
    let mut rng = Rng(0x5a3b_1ed0_0000_0017);
    // Two or three letters, so that values overlap, repeat and sit side by side.
    for round in 0..600 {
        let alphabet: &[u8] = if round % 2 == 0 { b"ab" } else { b"abz" };
        let count = match round % 3 {
            0 => 1,
            1 => 2 + rng.below(5),
            _ => 60 + rng.below(100),
        };
        let values: Vec<Vec<u8>> = (0..count)
            .map(|_| (0..SAMPLED_SHORTEST + rng.below(7)).map(|_| alphabet[rng.below(alphabet.len())]).collect())
            .collect();
        let masker = Masker::build(&values, Sampling::Always).expect("masker builds");
        assert!(masker.inner.sampler.is_some(), "{values:?}");
        let text: Vec<u8> = (0..rng.below(200)).map(|_| alphabet[rng.below(alphabet.len())]).collect();
        masks_as_naive(&masker, &text, &mut rng);
    }
}

/// Up to `length` bytes: `values` whole, cut short at either end, and run together,
/// between random letters of `alphabet`.
fn text_of(values: &[Vec<u8>], alphabet: &[u8], length: usize, rng: &mut Rng) -> Vec<u8> {
    let mut text = Vec::new();
    while text.len() < length {
        let value = &values[rng.below(values.len())];
        match rng.below(4) {
            0 => text.extend_from_slice(value),
            1 => {
                let cut = rng.below(value.len());
                text.extend_from_slice(if rng.below(2) == 0 { &value[..cut] } else { &value[cut..] });
            }
            _ => text.extend((0..rng.below(24)).map(|_| alphabet[rng.below(alphabet.len())])),
        }
    }
    text
}

/// For each of `rounds` sets of values (and the letters of the text around them) that
/// `values_of` makes, a sampling masker masks texts as [`naive`] does; more than half of
/// their sampled windows are compared rather than searched.
fn most_windows_compared(
    mut rng: Rng,
    rounds: usize,
    mut values_of: impl FnMut(usize, &mut Rng) -> (&'static [u8], Vec<Vec<u8>>),
) {
    let (mut compared, mut windows, mut found) = (0, 0, Vec::new());
    for round in 0..rounds {
        let (alphabet, values) = values_of(round, &mut rng);
        let masker = Masker::build(&values, Sampling::Always).expect("masker builds");
        let text = text_of(&values, alphabet, rng.below(400), &mut rng);
        let sampler = masker.inner.sampler.as_ref().expect("sampled");
        let longest = masker.inner.longest;
        for window in sampler.windows(&text, longest) {
            windows += 1;
            if sampler.occurrences(&masker.inner.values, &text, window, WINDOW_COMPARED * longest, &mut found) {
                compared += 1;
            }
        }
        masks_as_naive(&masker, &text, &mut rng);
    }
    assert!(compared * 2 > windows, "only {compared} windows of {windows} were compared rather than searched");
}

#[test]
fn occurrences_compared_in_windows_are_masked_leftmost_longest() {
    most_windows_compared(Rng(0x0cc0_57ed_0000_0031), 900, |round, rng| {
        // Enough letters that most runs are in few places, few enough that values overlap.
        let alphabet: &[u8] = [&b"abcd"[..], b"abcdefgh", b"abcdefghijklmnop"][round % 3];
        let count = 1 + rng.below(if round % 2 == 0 { 4 } else { 40 });
        let values = (0..count)
            .map(|_| (0..SAMPLED_SHORTEST + rng.below(9)).map(|_| alphabet[rng.below(alphabet.len())]).collect())
            .collect();
        (alphabet, values)
    });
}

#[test]
fn values_that_begin_alike_are_compared_where_they_begin() {
    // Many values sharing their first bytes (the runs there are in more places than are
    // compared), then a part of their own, then a letter repeated (a run at many offsets).
    most_windows_compared(Rng(0xa11c_e000_0000_0041), 600, |round, rng| {
        let alphabet: &[u8] = [&b"abcdef"[..], b"abcdefghijklmnop"][round % 2];
        let letters = |count: usize, rng: &mut Rng| -> Vec<u8> {
            (0..count).map(|_| alphabet[rng.below(alphabet.len())]).collect()
        };
        let shared = letters(GRAM + rng.below(12), rng);
        let count = PLACES_COMPARED as usize + 1 + rng.below(60);
        let values = (0..count)
            .map(|_| {
                let mut value = shared.clone();
                let own = SAMPLED_SHORTEST.saturating_sub(shared.len()) + 1 + rng.below(4);
                value.extend(letters(own, rng));
                let repeated = alphabet[rng.below(alphabet.len())];
                value.extend(std::iter::repeat_n(repeated, rng.below(12)));
                value
            })
            .collect();
        (alphabet, values)
    });
}

#[test]
fn values_in_ordinary_text_are_found_at_every_offset() {
    // Each value put at every offset of a line of text, and at the end of the text.
    let values = ["ghp_0123456789abcdefghij", "hunter2-hunter2", "secret-value-042-xxxx"];
    let masker = Masker::build(values, Sampling::Always).expect("masker builds");
    assert!(masker.inner.sampler.is_some());
    for value in values {
        for offset in 0..40 {
            let text = format!("{}{value} tail", "compiling crate ".repeat(3).get(..offset).unwrap_or(""));
            let masked = masker.mask(text.as_bytes());
            assert_eq!(masked, text.replace(value, "***").as_bytes(), "{text}");
            let end = format!("{}{value}", "x".repeat(offset));
            assert_eq!(masker.mask(end.as_bytes()), end.replace(value, "***").as_bytes(), "{end}");
        }
    }
}

#[test]
fn values_sharing_their_first_bytes_are_masked_leftmost_longest_where_those_are() {
    // Values beginning with the same bytes (which may repeat themselves, as `abab` does),
    // then their own; some alike for longer than the shortest value (the automaton then
    // picks among them), and run together, cut short and between random letters.
    let mut rng = Rng(0x5ba2_ed00_0000_0053);
    for round in 0..600 {
        let alphabet: &[u8] = [&b"ab"[..], b"abc", b"abcdefghij"][round % 3];
        let letters = |count: usize, rng: &mut Rng| -> Vec<u8> {
            (0..count).map(|_| alphabet[rng.below(alphabet.len())]).collect()
        };
        let shared = letters(SHARED_LEAST + rng.below(12), &mut rng);
        let count = 1 + rng.below(40);
        let values: Vec<Vec<u8>> = (0..count)
            .map(|_| {
                let mut value = shared.clone();
                value.extend(letters(SAMPLED_SHORTEST.saturating_sub(shared.len()) + rng.below(6), &mut rng));
                value
            })
            .collect();
        let masker = Masker::build(&values, Sampling::Shared).expect("masker builds");
        assert!(masker.inner.shared.is_some(), "{values:?}");
        let text = text_of(&values, alphabet, rng.below(400), &mut rng);
        masks_as_naive(&masker, &text, &mut rng);
    }
}

#[test]
fn where_more_values_begin_alike_than_are_compared_the_automaton_searches_on() {
    // Six values alike in the bytes their beginnings are told apart by (the first eight and
    // the eight up to the shortest length), differing between them.
    let values: Vec<String> = ["0000", "1111", "2222", "3333", "4444"]
        .iter()
        .map(|middle| format!("abcdefgh{middle}ijklmnop"))
        .chain(["abcdefghQQQQijklmnop and twenty bytes more".to_string()])
        .collect();
    let masker = Masker::build(&values, Sampling::Shared).expect("masker builds");
    let shared = masker.inner.shared.as_ref().expect("shared");
    assert!(shared.starts.at(b"abcdefghZZZZijklmnop", 0).len() > PLACES_COMPARED as usize);
    let text = b"abcdefghZZZZijklmnopabcdefgh0000ijklmnop abcdefghQQQQijklmnop and twenty bytes more";
    assert_eq!(masker.mask(text), b"abcdefghZZZZijklmnop*** ***");
    masks_as_naive(&masker, text, &mut Rng(7));
}

#[test]
fn a_text_dense_with_the_shared_bytes_is_searched_once_the_comparisons_cost_too_much() {
    // Four long values told apart only in their middles, and a text of the bytes they
    // share at every position: each comparison would run the length of the values.
    let values: Vec<String> = (0..4).map(|at| format!("{}q{}", "x".repeat(8 + at), "x".repeat(120 - at))).collect();
    let masker = Masker::build(&values, Sampling::Shared).expect("masker builds");
    let shared = masker.inner.shared.as_ref().expect("shared");
    let dense = "x".repeat(3000);
    let mut budget = 0;
    assert!(matches!(shared.longest_at(&masker.inner.values, dense.as_bytes(), 0, &mut budget), There::Search));
    let mut budget = usize::MAX;
    assert!(matches!(shared.longest_at(&masker.inner.values, dense.as_bytes(), 0, &mut budget), There::Nothing));
    // Past the budget (eight bytes compared for each byte of the text), the automaton
    // still finds the value at the end.
    let text = format!("{dense} {} tail", values[2]);
    assert_eq!(masker.mask(text.as_bytes()), format!("{dense} *** tail").as_bytes());
    masks_as_naive(&masker, text.as_bytes(), &mut Rng(11));
}

#[test]
fn many_tokens_are_sampled_many_values_beginning_alike_are_shared_and_few_values_are_neither() {
    let built = |values: &[String]| Masker::new(values).expect("masker builds");
    let sampled = |values: &[String]| built(values).inner.sampler.is_some();
    let shared = |values: &[String]| built(values).inner.shared.is_some();
    let tokens: Vec<String> =
        (0..GROUP + 1).map(|index| format!("{}{index:08}", char::from(b'a' + (index % 26) as u8))).collect();
    assert!(sampled(&tokens) && !shared(&tokens));
    assert!(!sampled(&tokens[..GROUP]), "one packed search is faster");
    let alike: Vec<String> = (0..100).map(|index| format!("secret-value-{index:03}")).collect();
    assert!(shared(&alike) && !sampled(&alike), "found where `secret-value-` is");
    assert!(!shared(&alike[..GROUP]), "one packed search is faster");
    let short: Vec<String> = (0..100).map(|index| format!("secret-{index:03}")).collect();
    assert!(shared(&short), "ten bytes, beginning with seven they share");
    let tiny: Vec<String> = (0..100).map(|index| format!("sec{index:03}")).collect();
    assert!(!shared(&tiny) && !sampled(&tiny), "shorter than eight bytes: the automaton");
    let three: Vec<String> =
        (0..100).map(|index| format!("ab-{}{index:014}", char::from(b'a' + (index % 26) as u8))).collect();
    assert!(!shared(&three) && sampled(&three), "three bytes shared are too few: sampled");
    let mut short = tokens.clone();
    short.push("1234567".into());
    assert!(!sampled(&short), "a value shorter than eight bytes");
    let masker = Masker::new(&short).expect("masker builds");
    assert_eq!(masker.mask(b"a 1234567 b c00000028"), b"a *** b ***");
    let forced = |values: &[&str]| Masker::build(values, Sampling::Always).expect("masker builds");
    assert!(forced(&["12345678", "abcdefgh"]).inner.sampler.is_some());
    assert!(forced(&["12345678", "1234567"]).inner.sampler.is_none());
}
