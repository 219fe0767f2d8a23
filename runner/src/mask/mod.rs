//! Secret masking: every occurrence of a secret value in a byte stream becomes `***`, even when split across chunks.
//!
//! Matching is leftmost-longest (aho-corasick), so of two overlapping secrets the longer is masked.
//! Up to 256 values that begin with more than three different bytes (random tokens) are
//! searched with aho-corasick's packed (SIMD) searchers, 64 values each, which find
//! candidates by each value's first bytes, instead of its automaton, whose prefilter gives up
//! on more than three first bytes (4 times faster for 100 random tokens). Fewer first bytes,
//! more values, or a CPU without the instructions take the automaton.
//! More than 64 values, each at least 8 bytes long, that all begin with the same
//! [`SHARED_LEAST`] bytes or more are found where those bytes are ([`Shared`]): `memmem`
//! finds them, and there the values that begin as the text does are compared.
//! Other sets of more than 64 values, each at least [`SAMPLED_SHORTEST`] bytes long, that
//! begin with more than three different bytes or are all at least [`SAMPLED_ALIKE`] bytes
//! long, are found by sampling the text ([`Sampler`]): only the four bytes at every
//! `shortest - 3`th position are looked up, in a bitmap of the four bytes found at each of a
//! value's first `shortest - 3` positions, since the first such position an occurrence spans
//! is one of them; in the windows around the positions found there, the values holding those
//! four bytes there are compared where they would be, or, when many values hold them at one
//! or two offsets (a part many share), those of the values that begin as the text does
//! there; when they are at more offsets, the automaton (a DFA, without a prefilter) searches
//! the window.
//! Both copy the text first and mask it in the copy: the copy brings it into the cache faster
//! than the look-ups would.
//! A stream holds back only the bytes that could still begin a secret (a proper prefix of one):
//! never more than the longest value minus one byte.

mod sampled;

use sampled::{COMPARED_PER_BYTE, SAMPLED_ALIKE, Sampler, Shared, There, WINDOW_COMPARED};
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind, packed};

/// What a secret value becomes.
pub const MASK: &[u8] = b"***";

/// The secret values to mask; cheap to clone.
#[derive(Clone)]
pub struct Masker {
    inner: Arc<Inner>,
}

struct Inner {
    /// `None` when there are no values.
    finder: Option<Finder>,
    /// `None` unless more than [`GROUP`] values share their first bytes ([`Shared`]).
    shared: Option<Shared>,
    /// `None` when a value is shorter than [`SAMPLED_SHORTEST`], or the values share their
    /// first bytes.
    sampler: Option<Sampler>,
    /// The values, sorted and deduplicated, to find which could still begin at a chunk's end.
    values: Vec<Vec<u8>>,
    /// The longest value's length.
    longest: usize,
    /// Their first bytes, for [`Masker::hold_from`].
    beginnings: Beginnings,
}

/// The first byte and the first two bytes of each value: a tail of the text that begins
/// otherwise begins no value, and needs no search among them.
struct Beginnings {
    firsts: [u64; 4],
    pairs: Box<[u64; 1024]>,
}

impl Beginnings {
    fn new(values: &[Vec<u8>]) -> Beginnings {
        let mut beginnings = Beginnings { firsts: [0; 4], pairs: Box::new([0; 1024]) };
        for value in values {
            if let [first, rest @ ..] = value.as_slice() {
                beginnings.firsts[usize::from(*first) / 64] |= 1 << (first % 64);
                if let [second, ..] = rest {
                    let pair = usize::from(*first) << 8 | usize::from(*second);
                    beginnings.pairs[pair / 64] |= 1 << (pair % 64);
                }
            }
        }
        beginnings
    }

    /// Whether some value may begin with `tail` (`false` only when none does).
    fn may_begin(&self, tail: &[u8]) -> bool {
        match tail {
            [] => false,
            [first] => self.firsts[usize::from(*first) / 64] & (1 << (first % 64)) != 0,
            [first, second, ..] => {
                let pair = usize::from(*first) << 8 | usize::from(*second);
                self.pairs[pair / 64] & (1 << (pair % 64)) != 0
            }
        }
    }
}

/// The values could not be compiled into a matcher (only for absurdly many or long values).
#[derive(Debug, thiserror::Error)]
#[error("cannot build the secret masker: {0}")]
pub struct MaskError(#[from] aho_corasick::BuildError);

impl fmt::Debug for Masker {
    /// Never prints a value.
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.debug_struct("Masker").field("values", &self.inner.values.len()).finish()
    }
}

impl Masker {
    /// A masker for `values`; empty values are ignored.
    pub fn new(values: impl IntoIterator<Item = impl AsRef<[u8]>>) -> Result<Masker, MaskError> {
        Masker::build(values, Sampling::WhereFaster)
    }

    fn build(values: impl IntoIterator<Item = impl AsRef<[u8]>>, sampling: Sampling) -> Result<Masker, MaskError> {
        let mut values: Vec<Vec<u8>> =
            values.into_iter().map(|value| value.as_ref().to_vec()).filter(|value| !value.is_empty()).collect();
        values.sort();
        values.dedup();
        let longest = values.iter().map(Vec::len).max().unwrap_or(0);
        let (share, sample) = match sampling {
            Sampling::WhereFaster => {
                let many = values.len() > GROUP;
                let shortest = values.iter().map(Vec::len).min().unwrap_or(0);
                (many, many && (first_bytes(&values) > 3 || shortest >= SAMPLED_ALIKE))
            }
            #[cfg(test)]
            Sampling::Always => (false, true),
            #[cfg(test)]
            Sampling::Shared => (true, false),
        };
        let shared = if share { Shared::new(&values) } else { None };
        let sampler = if sample && shared.is_none() { Sampler::new(&values) } else { None };
        let windowed = sampler.is_some() || shared.is_some();
        let finder = if values.is_empty() { None } else { Some(Finder::new(&values, windowed)?) };
        let beginnings = Beginnings::new(&values);
        Ok(Masker { inner: Arc::new(Inner { finder, shared, sampler, values, longest, beginnings }) })
    }

    /// Whether there is nothing to mask.
    pub fn is_empty(&self) -> bool {
        self.inner.values.is_empty()
    }

    /// The length of the longest value (0 when empty).
    pub fn longest(&self) -> usize {
        self.inner.longest
    }

    /// `bytes` with every value replaced by `***`.
    pub fn mask(&self, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(bytes.len());
        let end = self.mask_into(bytes, Hold::From(bytes.len()), &mut out);
        out.extend_from_slice(&bytes[end..]);
        out
    }

    /// A stream for masking output that arrives in chunks.
    pub fn stream(&self) -> MaskStream {
        MaskStream { masker: self.clone(), carry: Vec::new() }
    }

    /// Appends `bytes`, masked, to `out` up to the first byte at or after the held ones that no
    /// match starting before them covers; matches starting among them are left alone.
    /// Returns where it stopped.
    fn mask_into(&self, bytes: &[u8], hold: Hold, out: &mut Vec<u8>) -> usize {
        let Some(finder) = &self.inner.finder else {
            let hold = self.hold(bytes, hold);
            out.extend_from_slice(&bytes[..hold]);
            return hold;
        };
        if let Some(shared) = &self.inner.shared {
            return self.mask_shared(shared, finder, bytes, hold, out);
        }
        if let Some(sampler) = &self.inner.sampler {
            return self.mask_sampled(sampler, finder, bytes, hold, out);
        }
        let hold = self.hold(bytes, hold);
        let mut done = 0;
        let mut mask = |start: usize, end: usize| {
            if start >= hold {
                return false;
            }
            out.extend_from_slice(&bytes[done..start]);
            out.extend_from_slice(MASK);
            done = end;
            true
        };
        for (start, end) in finder.matches(bytes) {
            if !mask(start, end) {
                break;
            }
        }
        if done < hold {
            out.extend_from_slice(&bytes[done..hold]);
            done = hold;
        }
        done
    }

    /// [`Masker::mask_into`] with a [`Sampler`]: the bytes are copied first, in one pass that
    /// also brings them into the cache for the look-ups (which, reading a few bytes at a
    /// time, would wait for memory), and each match is then masked in the copy, which shrinks
    /// (every sampled value is longer than [`MASK`]).
    fn mask_sampled(&self, sampler: &Sampler, finder: &Finder, bytes: &[u8], hold: Hold, out: &mut Vec<u8>) -> usize {
        let mut copy = InPlace::new(out, bytes);
        let hold = self.hold(bytes, hold);
        let mut found = Vec::new();
        let (values, longest) = (&self.inner.values, self.inner.longest);
        // Every match lies whole in one window: found window by window, in order.
        'windows: for (from, to) in sampler.windows(bytes, longest) {
            if from >= hold {
                break;
            }
            // Leftmost-longest: of the occurrences from the earliest start, the longest, then
            // the same from its end.
            let compared = sampler.occurrences(values, bytes, (from, to), WINDOW_COMPARED * longest, &mut found);
            let mut searched = (!compared).then(|| finder.matches(&bytes[from..to]));
            let (mut chosen, mut next) = (found.iter().copied(), from);
            loop {
                let (start, end) = match &mut searched {
                    Some(matches) => match matches.next() {
                        Some((start, end)) => (from + start, from + end),
                        None => break,
                    },
                    None => match chosen.find(|&(start, _)| start >= next) {
                        Some(occurrence) => occurrence,
                        None => break,
                    },
                };
                next = end;
                if start >= hold {
                    break 'windows;
                }
                copy.mask(out, start, end);
            }
        }
        copy.finish(out, hold)
    }

    /// [`Masker::mask_into`] with values that share their first bytes ([`Shared`]): where
    /// those bytes are, the longest value there, if any, is masked; the search goes on from its
    /// end, or from the next byte. Where more values begin alike than are compared, or the
    /// comparisons have cost [`COMPARED_PER_BYTE`] times the text (a text dense with the
    /// shared bytes), the automaton searches the rest. Copied first, as
    /// [`Masker::mask_sampled`] does.
    fn mask_shared(&self, shared: &Shared, finder: &Finder, bytes: &[u8], hold: Hold, out: &mut Vec<u8>) -> usize {
        let mut copy = InPlace::new(out, bytes);
        let hold = self.hold(bytes, hold);
        let (values, longest) = (&self.inner.values, self.inner.longest);
        let mut budget = COMPARED_PER_BYTE * (bytes.len() + longest);
        let mut from = 0;
        while let Some(found) = bytes.get(from..).and_then(|rest| shared.beginning.find(rest)) {
            let start = from + found;
            if start >= hold {
                break;
            }
            match shared.longest_at(values, bytes, start, &mut budget) {
                There::Value(end) => {
                    copy.mask(out, start, end);
                    from = end;
                }
                There::Nothing => from = start + 1,
                There::Search => {
                    for (match_start, end) in finder.matches(&bytes[start..]) {
                        if start + match_start >= hold {
                            break;
                        }
                        copy.mask(out, start + match_start, start + end);
                    }
                    break;
                }
            }
        }
        copy.finish(out, hold)
    }

    /// Where the held bytes of `bytes` begin.
    fn hold(&self, bytes: &[u8], hold: Hold) -> usize {
        match hold {
            Hold::From(hold) => hold,
            Hold::Prefix => self.hold_from(bytes),
        }
    }

    /// The first position from which `bytes[position..]` is a proper prefix of some value:
    /// the bytes a stream must hold back (`bytes.len()` when there is none).
    fn hold_from(&self, bytes: &[u8]) -> usize {
        let values = &self.inner.values;
        let earliest = bytes.len().saturating_sub(self.inner.longest.saturating_sub(1));
        (earliest..bytes.len())
            .find(|&position| {
                let tail = &bytes[position..];
                if !self.inner.beginnings.may_begin(tail) {
                    return false;
                }
                // Values longer than `tail` that start with it sort right after it.
                let after = values.partition_point(|value| value.as_slice() <= tail);
                values.get(after).is_some_and(|value| value.starts_with(tail))
            })
            .unwrap_or(bytes.len())
    }
}

/// The masked copy [`Masker::mask_sampled`] and [`Masker::mask_shared`] make: the bytes
/// copied whole after what `out` held, held bytes too (which [`InPlace::finish`] cuts off:
/// then finding them reads the cache, not memory one byte at a time), then each match masked
/// in place: the copy only shrinks, every value they take being longer than [`MASK`].
struct InPlace {
    /// Where the copy begins in `out`.
    base: usize,
    /// `out[base..write]` is the masked text of the bytes before `done`, never longer.
    done: usize,
    write: usize,
}

impl InPlace {
    fn new(out: &mut Vec<u8>, bytes: &[u8]) -> InPlace {
        let base = out.len();
        out.extend_from_slice(bytes);
        InPlace { base, done: 0, write: base }
    }

    /// Masks the match `start..end`, which begins at or after the end of the one before.
    fn mask(&mut self, out: &mut Vec<u8>, start: usize, end: usize) {
        out.copy_within(self.base + self.done..self.base + start, self.write);
        self.write += start - self.done;
        if out.len() < self.write + MASK.len() {
            out.resize(self.write + MASK.len(), 0);
        }
        out[self.write..self.write + MASK.len()].copy_from_slice(MASK);
        self.write += MASK.len();
        self.done = end;
    }

    /// Ends the copy at `hold`, or at the last match's end when that is later; returns where.
    fn finish(mut self, out: &mut Vec<u8>, hold: usize) -> usize {
        if self.done < hold {
            out.copy_within(self.base + self.done..self.base + hold, self.write);
            self.write += hold - self.done;
            self.done = hold;
        }
        out.truncate(self.write);
        self.done
    }
}

/// Which bytes at the end of a text [`Masker::mask_into`] holds back.
#[derive(Clone, Copy)]
enum Hold {
    /// Those from this position on.
    From(usize),
    /// Those that could begin a value ([`Masker::hold_from`]).
    Prefix,
}

/// When a masker finds values where their shared first bytes are ([`Shared`]) or samples the
/// text ([`Sampler`]).
#[derive(Clone, Copy)]
enum Sampling {
    /// Only where the search of the whole text is slower: for more values than one packed
    /// searcher takes, where they share their first bytes if they do; if not, sampled when
    /// they begin with more than three different bytes (random tokens), or are all at least
    /// [`SAMPLED_ALIKE`] bytes long. Fewer values are found faster by their first bytes
    /// (`memchr`, `memmem` or one packed search), and short values beginning alike by the
    /// automaton's `memchr` for those bytes than by a look-up every few bytes.
    WhereFaster,
    /// Whenever every value is long enough, to test the sampler with any values.
    #[cfg(test)]
    Always,
    /// Whenever the values share enough first bytes, to test [`Shared`] with any values.
    #[cfg(test)]
    Shared,
}

/// How many different bytes the values begin with.
fn first_bytes(values: &[Vec<u8>]) -> usize {
    values.iter().filter_map(|value| value.first()).copied().collect::<std::collections::BTreeSet<u8>>().len()
}

/// The search for values, leftmost-longest.
enum Finder {
    /// Packed searchers of at most [`GROUP`] values each, for up to [`PACKED_LIMIT`] values.
    Packed(Vec<packed::Searcher>),
    Automaton(AhoCorasick),
}

/// The most values one packed searcher takes (aho-corasick's own limit for its SIMD search).
const GROUP: usize = 64;

/// The most values searched with packed searchers: each group is one more pass over the text.
const PACKED_LIMIT: usize = 4 * GROUP;

impl Finder {
    /// A finder for the whole text, or for the short windows a [`Sampler`] finds (`sampled`):
    /// there a DFA without a prefilter, which starts at once.
    fn new(values: &[Vec<u8>], sampled: bool) -> Result<Finder, MaskError> {
        if sampled {
            let mut builder = AhoCorasick::builder();
            builder.match_kind(MatchKind::LeftmostLongest).prefilter(false);
            // A DFA grows with the values' total length: past its limits, the default kind.
            let automaton = match builder.kind(Some(aho_corasick::AhoCorasickKind::DFA)).build(values) {
                Ok(automaton) => automaton,
                Err(_) => builder.kind(None).build(values)?,
            };
            return Ok(Finder::Automaton(automaton));
        }
        // With three first bytes or fewer the automaton's prefilter looks for those bytes
        // with `memchr`, faster than the packed search when the bytes are rare.
        if values.len() <= PACKED_LIMIT && first_bytes(values) > 3 {
            let groups: Option<Vec<packed::Searcher>> = values
                .chunks(GROUP)
                .map(|group| {
                    packed::Config::new().match_kind(packed::MatchKind::LeftmostLongest).builder().extend(group).build()
                })
                .collect();
            if let Some(groups) = groups {
                return Ok(Finder::Packed(groups));
            }
        }
        Ok(Finder::Automaton(AhoCorasick::builder().match_kind(MatchKind::LeftmostLongest).build(values)?))
    }

    /// The matches in `bytes`, each starting at or after the end of the one before.
    fn matches<'a>(&'a self, bytes: &'a [u8]) -> Matches<'a> {
        let groups = match self {
            Finder::Packed(groups) => groups.len(),
            Finder::Automaton(_) => 0,
        };
        Matches { finder: self, bytes, from: 0, next: vec![Next::Unknown; groups] }
    }
}

/// A group's next match, as far as it was searched.
#[derive(Clone, Copy)]
enum Next {
    Unknown,
    At(usize, usize),
    None,
}

/// See [`Finder::matches`]. Each group's next match is kept until the search passes it, so
/// each group reads the text once.
struct Matches<'a> {
    finder: &'a Finder,
    bytes: &'a [u8],
    from: usize,
    next: Vec<Next>,
}

impl Iterator for Matches<'_> {
    /// A match's start and end.
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        let (bytes, from) = (self.bytes, self.from);
        if from > bytes.len() {
            return None;
        }
        let found = match self.finder {
            Finder::Automaton(automaton) => {
                automaton.find(aho_corasick::Input::new(bytes).range(from..)).map(|m| (m.start(), m.end()))
            }
            Finder::Packed(groups) => {
                let mut best: Option<(usize, usize)> = None;
                for (group, next) in groups.iter().zip(self.next.iter_mut()) {
                    if let Next::At(start, _) = *next
                        && start < from
                    {
                        *next = Next::Unknown;
                    }
                    if let Next::Unknown = *next {
                        *next = match group.find_in(bytes, aho_corasick::Span::from(from..bytes.len())) {
                            Some(found) => Next::At(found.start(), found.end()),
                            None => Next::None,
                        };
                    }
                    // The leftmost of the groups' matches, and of two at one place the longer.
                    if let Next::At(start, end) = *next
                        && best.is_none_or(|(best_start, best_end)| {
                            (start, std::cmp::Reverse(end)) < (best_start, std::cmp::Reverse(best_end))
                        })
                    {
                        best = Some((start, end));
                    }
                }
                best
            }
        };
        if let Some((_, end)) = found {
            self.from = end;
        }
        found
    }
}

/// Masks a byte stream that arrives in chunks; see [`Masker::stream`].
#[derive(Debug)]
pub struct MaskStream {
    masker: Masker,
    /// Bytes that could still begin a value, waiting for the next chunk.
    carry: Vec<u8>,
}

impl MaskStream {
    /// Takes the next chunk and returns the masked bytes that are safe to emit now.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(chunk.len() + self.carry.len());
        self.push_into(chunk, &mut out);
        out
    }

    /// Like [`MaskStream::push`], appending to `out`.
    pub fn push_into(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        if self.masker.is_empty() {
            out.extend_from_slice(chunk);
            return;
        }
        let mut chunk = chunk;
        if !self.carry.is_empty() {
            let (held, longest) = (self.carry.len(), self.masker.longest());
            let mut joint = std::mem::take(&mut self.carry);
            if chunk.len() < longest {
                joint.extend_from_slice(chunk);
                let done = self.masker.mask_into(&joint, Hold::Prefix, out);
                self.carry = joint.split_off(done);
                return;
            }
            // A value begun in the held bytes ends within the chunk's first `longest - 1` bytes:
            // only those are joined to them, and the rest of the chunk is not copied first.
            joint.extend_from_slice(&chunk[..longest - 1]);
            let done = self.masker.mask_into(&joint, Hold::From(held), out);
            chunk = &chunk[done - held..];
            joint.clear();
            self.carry = joint;
        }
        // The chunk (or what the held bytes left of it) is masked where it is, joined to nothing.
        let done = self.masker.mask_into(chunk, Hold::Prefix, out);
        self.carry.extend_from_slice(&chunk[done..]);
    }

    /// Ends the stream and returns the rest, masked.
    pub fn finish(self) -> Vec<u8> {
        self.masker.mask(&self.carry)
    }

    /// How many bytes are held back, waiting for the next chunk.
    pub fn held(&self) -> usize {
        self.carry.len()
    }
}
