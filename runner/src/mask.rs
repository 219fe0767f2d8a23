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

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
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

/// The fewest first bytes more than [`GROUP`] values must all share to be found where those
/// bytes are ([`Shared`]) rather than sampled: `memmem` finds four bytes fast in any text.
const SHARED_LEAST: usize = 4;

/// How many bytes of values [`Masker::mask_shared`] compares for each byte of the text, at
/// most, before the automaton searches the rest: the work stays linear in the text.
const COMPARED_PER_BYTE: usize = 8;

/// Values that all begin with the same [`SHARED_LEAST`] bytes or more, each at least
/// [`WORD`] bytes long: every occurrence begins where those bytes are, which `memmem` finds (with SIMD, by
/// the rarest of their bytes), and there the values that begin as the text does ([`Starts`])
/// are compared.
struct Shared {
    beginning: memchr::memmem::Finder<'static>,
    starts: Starts,
}

impl Shared {
    /// `None` when the values, sorted, share fewer than [`SHARED_LEAST`] first bytes, or one
    /// is shorter than [`WORD`].
    fn new(values: &[Vec<u8>]) -> Option<Shared> {
        // Sorted: what the first and the last share, all share.
        let (first, last) = (values.first()?, values.last()?);
        let shared = first.iter().zip(last).take_while(|(one, other)| one == other).count();
        if shared < SHARED_LEAST {
            return None;
        }
        let starts = Starts::new(values)?;
        Some(Shared { beginning: memchr::memmem::Finder::new(&first[..shared]).into_owned(), starts })
    }

    /// The longest value at `start` of `bytes`, found by comparing at most
    /// [`PLACES_COMPARED`] values, their lengths taken from `budget`.
    fn longest_at(&self, values: &[Vec<u8>], bytes: &[u8], start: usize, budget: &mut usize) -> There {
        let alike = self.starts.at(bytes, start);
        let cost: usize = alike.iter().map(|&index| values[index as usize].len()).sum();
        if alike.len() > PLACES_COMPARED as usize || cost > *budget {
            return There::Search;
        }
        *budget -= cost;
        let there = alike.iter().map(|&index| &values[index as usize]);
        match there.filter(|value| bytes[start..].starts_with(value)).map(Vec::len).max() {
            Some(length) => There::Value(start + length),
            None => There::Nothing,
        }
    }
}

/// What [`Shared::longest_at`] found.
enum There {
    /// The longest value there, ending here.
    Value(usize),
    /// No value.
    Nothing,
    /// Too many values to compare: the automaton is to search from there.
    Search,
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

/// The shortest values beginning with three different bytes or fewer that are sampled: a
/// look-up every 13 bytes or more costs less than stopping at every one of those bytes in
/// ordinary text.
const SAMPLED_ALIKE: usize = 16;

/// The shortest values the [`Sampler`] takes: with shorter ones it would sample too often.
const SAMPLED_SHORTEST: usize = 8;

// [`Masker::mask_sampled`] masks in place: a sampled value is longer than its mask.
const _: () = assert!(SAMPLED_SHORTEST > MASK.len());

/// How many bytes the [`Sampler`] looks up at once.
const GRAM: usize = 4;

/// A filter that tells where values may be, looking at a few positions of the text.
///
/// A value of length `n` holds `n - GRAM + 1` runs of [`GRAM`] bytes, starting at
/// consecutive positions; with `stride = shortest - GRAM + 1`, an occurrence of any value
/// therefore has one of them start at a multiple of `stride`, and the first such run is one
/// of the value's first `stride` runs (it starts less than `stride` bytes into the value).
/// The bitmap holds a bit for each of those runs of every value, by hash (a bit for a run
/// no value holds there only costs a search), so a position whose bit is clear is the first
/// sampled run of no occurrence: the search runs only in the windows around the positions
/// whose bit is set.
struct Sampler {
    stride: usize,
    bits: Box<[u64; SAMPLER_BITS / 64]>,
    /// Where each run occurs in the values, for [`Sampler::occurrences`].
    places: Places,
}

/// The values and offsets at which each run of [`GRAM`] bytes occurs, and the values by
/// their beginnings.
struct Places {
    /// For each run, where it occurs.
    runs: HashMap<u32, Run, BuildHasherDefault<RunHasher>>,
    /// Each a value's index and the offset of the run in it, grouped by run.
    at: Vec<(u32, u32)>,
    starts: Starts,
}

/// The bytes of each of the two words a value's beginning is known by ([`Starts::key`]).
const WORD: usize = 8;

/// The values by their beginnings: which could occur where the text begins a certain way.
struct Starts {
    /// For each [`Starts::key`] of a value, the range of `begun` that lists the values with it.
    keys: HashMap<(u64, u64), (u32, u32), BuildHasherDefault<RunHasher>>,
    /// Values' indexes, grouped by their keys.
    begun: Vec<u32>,
    /// The shortest value's length, at least [`WORD`].
    shortest: usize,
}

impl Starts {
    /// `None` when a value is shorter than [`WORD`].
    fn new(values: &[Vec<u8>]) -> Option<Starts> {
        let shortest = values.iter().map(Vec::len).min().filter(|&shortest| shortest >= WORD)?;
        let mut starts = Starts { keys: HashMap::default(), begun: Vec::with_capacity(values.len()), shortest };
        let mut begun: Vec<((u64, u64), u32)> = values
            .iter()
            .enumerate()
            .map(|(index, value)| Some((starts.key(value)?, u32::try_from(index).ok()?)))
            .collect::<Option<_>>()?;
        begun.sort_unstable();
        for group in begun.chunk_by(|one, other| one.0 == other.0) {
            let first = u32::try_from(starts.begun.len()).ok()?;
            starts.begun.extend(group.iter().map(|&(_, index)| index));
            starts.keys.insert(group[0].0, (first, u32::try_from(starts.begun.len()).ok()?));
        }
        Some(starts)
    }

    /// The first eight bytes of `bytes` and the eight up to the shortest value's length
    /// (which may overlap them): the same for a value and for the text where it occurs;
    /// `None` when `bytes` is shorter than the shortest value.
    fn key(&self, bytes: &[u8]) -> Option<(u64, u64)> {
        let word = |at: usize| bytes.get(at..at + WORD)?.try_into().ok().map(u64::from_le_bytes);
        Some((word(0)?, word(self.shortest - WORD)?))
    }

    /// The indexes of the values that may occur at `start` of `bytes` (the others do not).
    fn at(&self, bytes: &[u8], start: usize) -> &[u32] {
        let range = bytes.get(start..).and_then(|tail| self.keys.get(&self.key(tail)?));
        range.map_or(&[], |&(first, end)| &self.begun[first as usize..end as usize])
    }
}

/// Where a run occurs in the values.
#[derive(Clone, Copy)]
enum Run {
    /// In at most [`PLACES_COMPARED`] places: this range of [`Places::at`].
    Few(u32, u32),
    /// In more places (a part many values share), but at only these offsets of them (the
    /// first `.1`): an occurrence that holds the run there begins that many bytes before it.
    Offsets([u32; OFFSETS_COMPARED], u32),
    /// At more offsets than that.
    Crowded,
}

impl Places {
    /// Lists only the first `stride` runs of each value: the rest are never an occurrence's
    /// first sampled run ([`Sampler`]).
    fn new(values: &[Vec<u8>], stride: usize) -> Option<Places> {
        let mut runs = Vec::new();
        for (index, value) in values.iter().enumerate() {
            for (offset, run) in value.windows(GRAM).take(stride).enumerate() {
                runs.push((read_run(run), u32::try_from(index).ok()?, u32::try_from(offset).ok()?));
            }
        }
        runs.sort_unstable();
        let mut places =
            Places { runs: HashMap::default(), at: Vec::with_capacity(runs.len()), starts: Starts::new(values)? };
        for group in runs.chunk_by(|one, other| one.0 == other.0) {
            let first = u32::try_from(places.at.len()).ok()?;
            places.at.extend(group.iter().map(|&(_, index, offset)| (index, offset)));
            let end = u32::try_from(places.at.len()).ok()?;
            let run = if end - first <= PLACES_COMPARED {
                Run::Few(first, end)
            } else {
                let mut offsets: Vec<u32> = group.iter().map(|&(_, _, offset)| offset).collect();
                offsets.sort_unstable();
                offsets.dedup();
                match offsets.len() {
                    count @ 1..=OFFSETS_COMPARED => {
                        let mut kept = [0; OFFSETS_COMPARED];
                        kept[..count].copy_from_slice(&offsets);
                        Run::Offsets(kept, u32::try_from(count).ok()?)
                    }
                    _ => Run::Crowded,
                }
            };
            places.runs.insert(group[0].0, run);
        }
        Some(places)
    }
}

/// Hashes a run with a multiplication, its high half folded into the low one (the table
/// picks a bucket by the low bits, which a product alone takes from the run's low bits only).
#[derive(Default)]
struct RunHasher(u64);

impl RunHasher {
    fn mix(&mut self, value: u64) {
        let product = (self.0 ^ value).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = product ^ (product >> 32);
    }
}

impl Hasher for RunHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.mix(u64::from(*byte));
        }
    }

    fn write_u32(&mut self, run: u32) {
        self.mix(u64::from(run));
    }

    fn write_u64(&mut self, word: u64) {
        self.mix(word);
    }
}

/// The most places of one run [`Sampler::occurrences`] compares; a run found in more (a prefix
/// many values share) is left to the automaton.
const PLACES_COMPARED: u32 = 4;

/// The most offsets of a run in more places than [`PLACES_COMPARED`] at which it is looked
/// for by the values' beginnings ([`Run::Offsets`]).
const OFFSETS_COMPARED: usize = 2;

/// The sampler's bitmap's size in bits: 128 KiB, about 256 bits for each run of 100 values of
/// 40 bytes, so that few positions of ordinary text find a bit set by chance.
const SAMPLER_BITS: usize = 1 << 20;

impl Sampler {
    /// `None` when a value is shorter than [`SAMPLED_SHORTEST`] (or there are none).
    fn new(values: &[Vec<u8>]) -> Option<Sampler> {
        let shortest = values.iter().map(Vec::len).min()?;
        if shortest < SAMPLED_SHORTEST {
            return None;
        }
        // Made on the heap: the array is too large to pass through the stack.
        let bits = vec![0; SAMPLER_BITS / 64].into_boxed_slice().try_into().ok()?;
        let stride = shortest - GRAM + 1;
        let places = Places::new(values, stride)?;
        let mut sampler = Sampler { stride, bits, places };
        for value in values {
            for run in value.windows(GRAM).take(stride) {
                let bit = sampler.bit(run);
                sampler.bits[bit / 64] |= 1 << (bit % 64);
            }
        }
        Some(sampler)
    }

    /// Every occurrence of a value in `bytes[from..to]`, a window of [`Sampler::windows`],
    /// found by comparing the values that hold the run at each sampled position of the window
    /// among their first `stride` runs where they would be, or, when many values hold it at
    /// one or two offsets, the values that begin as the text does there; sorted by start, the
    /// longest first. `false` (and nothing found) when a run is in too many places, or the
    /// window is longer than `limit`: the automaton searches it instead.
    fn occurrences(
        &self,
        values: &[Vec<u8>],
        bytes: &[u8],
        (from, to): (usize, usize),
        limit: usize,
        found: &mut Vec<(usize, usize)>,
    ) -> bool {
        found.clear();
        if to - from > limit || to - from < GRAM {
            return false;
        }
        let stride = self.stride;
        for position in (from.div_ceil(stride) * stride..=to - GRAM).step_by(stride) {
            let run = read_run(&bytes[position..position + GRAM]);
            if !self.holds(run) {
                continue;
            }
            let Some(&run) = self.places.runs.get(&run) else { continue };
            // Whether the value `index` occurs at `start`; `false` when it does but not whole in
            // the window: the windows are not what this relies on.
            let mut compare = |index: u32, start: usize| {
                let value = &values[index as usize];
                if bytes.get(start..start + value.len()) != Some(value.as_slice()) {
                    return true;
                }
                found.push((start, start + value.len()));
                start >= from && start + value.len() <= to
            };
            let whole = match run {
                Run::Few(first, end) => self.places.at[first as usize..end as usize].iter().all(|&(index, offset)| {
                    position.checked_sub(offset as usize).is_none_or(|start| compare(index, start))
                }),
                Run::Offsets(offsets, count) => offsets[..count as usize].iter().all(|&offset| {
                    let Some(start) = position.checked_sub(offset as usize) else { return true };
                    let alike = self.places.starts.at(bytes, start);
                    // Many values alike in their first bytes: left to the automaton.
                    alike.len() <= PLACES_COMPARED as usize && alike.iter().all(|&index| compare(index, start))
                }),
                Run::Crowded => false,
            };
            if !whole {
                found.clear();
                return false;
            }
        }
        found.sort_unstable_by_key(|&(start, end)| (start, std::cmp::Reverse(end)));
        true
    }

    fn bit(&self, run: &[u8]) -> usize {
        hash(read_run(run))
    }

    /// Whether the run read as `run` has its bit set.
    fn holds(&self, run: u32) -> bool {
        let bit = hash(run);
        self.bits[bit / 64] & (1 << (bit % 64)) != 0
    }

    /// The windows of `bytes` that hold every occurrence of a value (each whole in one),
    /// in order, disjoint; `longest` is the longest value's length.
    fn windows<'a>(&'a self, bytes: &'a [u8], longest: usize) -> impl Iterator<Item = (usize, usize)> + 'a {
        // A value whose first sampled run is at `position` starts less than `stride` bytes
        // before it and ends at most `longest` bytes after it.
        let before = self.stride - 1;
        let mut hits = Hits { sampler: self, bytes, block: 0, found: 0 }
            .map(move |position| (position.saturating_sub(before), (position + longest).min(bytes.len())));
        let mut current = hits.next();
        std::iter::from_fn(move || {
            let (from, mut to) = current?;
            loop {
                match hits.next() {
                    Some((next_from, next_to)) if next_from <= to => to = next_to,
                    next => {
                        current = next;
                        return Some((from, to));
                    }
                }
            }
        })
    }

    /// Whether the run at `position` of `bytes` has its bit set (`false` past the end).
    fn set(&self, bytes: &[u8], position: usize) -> bool {
        bytes.get(position..position + GRAM).is_some_and(|run| self.holds(read_run(run)))
    }
}

/// The first [`GRAM`] bytes of `bytes` as a number.
fn read_run(bytes: &[u8]) -> u32 {
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// A run's bit in the [`Sampler`]'s bitmap.
fn hash(run: u32) -> usize {
    (run.wrapping_mul(0x9e37_79b1) >> (32 - SAMPLER_BITS.trailing_zeros())) as usize
}

/// The longest window (in longest values) whose occurrences are found by comparison rather
/// than by the automaton: a window that runs on is text full of values.
const WINDOW_COMPARED: usize = 4;

/// How many sampled positions [`Hits`] looks up before it branches on what it found.
const BLOCK: usize = 16;

/// The sampled positions whose bit is set, in order: looked up [`BLOCK`] at a time, without
/// a branch on each, so that the lookups overlap.
struct Hits<'a> {
    sampler: &'a Sampler,
    bytes: &'a [u8],
    /// The first position of the next block to look up.
    block: usize,
    /// The hits of the block before it not yet returned, one bit each.
    found: u32,
}

impl Iterator for Hits<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let stride = self.sampler.stride;
        while self.found == 0 {
            let block = self.block;
            match self.bytes.get(block..block + (BLOCK - 1) * stride + GRAM) {
                // The whole block is in the text: each run read with one load.
                Some(runs) => {
                    let mut found = 0;
                    for index in 0..BLOCK {
                        let at = index * stride;
                        let run =
                            runs.get(at..at + GRAM).and_then(|run| run.try_into().ok()).map_or(0, u32::from_le_bytes);
                        found |= u32::from(self.sampler.holds(run)) << index;
                    }
                    self.found = found;
                }
                None if block + GRAM > self.bytes.len() => return None,
                None => {
                    for index in 0..BLOCK {
                        self.found |= u32::from(self.sampler.set(self.bytes, block + index * stride)) << index;
                    }
                }
            }
            self.block += BLOCK * stride;
        }
        let index = self.found.trailing_zeros() as usize;
        self.found &= self.found - 1;
        Some(self.block - (BLOCK - index) * stride)
    }
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

#[cfg(test)]
mod tests {
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
            let values: Vec<Vec<u8>> = (0..count)
                .map(|_| (0..1 + rng.below(6)).map(|_| alphabet[rng.below(alphabet.len())]).collect())
                .collect();
            let text: Vec<u8> = (0..rng.below(80)).map(|_| alphabet[rng.below(alphabet.len())]).collect();
            let masker = Masker::new(&values).expect("masker builds");
            let expected = naive(&masker.inner.values, &text);
            assert_eq!(masker.mask(&text), expected, "{values:?} {text:?}");
            let sorted = &masker.inner.values;
            let automaton =
                AhoCorasick::builder().match_kind(MatchKind::LeftmostLongest).build(sorted).expect("automaton");
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
}
