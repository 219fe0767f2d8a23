//! Where values are looked for without searching the whole text: where the beginning they all
//! share is ([`Shared`]), or around the positions of a sampled text whose bytes may begin one
//! ([`Sampler`]).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::MASK;

/// The fewest first bytes more than [`GROUP`] values must all share to be found where those
/// bytes are ([`Shared`]) rather than sampled: `memmem` finds four bytes fast in any text.
pub(super) const SHARED_LEAST: usize = 4;

/// How many bytes of values [`Masker::mask_shared`] compares for each byte of the text, at
/// most, before the automaton searches the rest: the work stays linear in the text.
pub(super) const COMPARED_PER_BYTE: usize = 8;

/// Values that all begin with the same [`SHARED_LEAST`] bytes or more, each at least
/// [`WORD`] bytes long: every occurrence begins where those bytes are, which `memmem` finds (with SIMD, by
/// the rarest of their bytes), and there the values that begin as the text does ([`Starts`])
/// are compared.
pub(super) struct Shared {
    pub(super) beginning: memchr::memmem::Finder<'static>,
    pub(super) starts: Starts,
}

impl Shared {
    /// `None` when the values, sorted, share fewer than [`SHARED_LEAST`] first bytes, or one
    /// is shorter than [`WORD`].
    pub(super) fn new(values: &[Vec<u8>]) -> Option<Shared> {
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
    pub(super) fn longest_at(&self, values: &[Vec<u8>], bytes: &[u8], start: usize, budget: &mut usize) -> There {
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
pub(super) enum There {
    /// The longest value there, ending here.
    Value(usize),
    /// No value.
    Nothing,
    /// Too many values to compare: the automaton is to search from there.
    Search,
}

/// The shortest values beginning with three different bytes or fewer that are sampled: a
/// look-up every 13 bytes or more costs less than stopping at every one of those bytes in
/// ordinary text.
pub(super) const SAMPLED_ALIKE: usize = 16;

/// The shortest values the [`Sampler`] takes: with shorter ones it would sample too often.
pub(super) const SAMPLED_SHORTEST: usize = 8;

// [`Masker::mask_sampled`] masks in place: a sampled value is longer than its mask.
const _: () = assert!(SAMPLED_SHORTEST > MASK.len());

/// How many bytes the [`Sampler`] looks up at once.
pub(super) const GRAM: usize = 4;

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
pub(super) struct Sampler {
    stride: usize,
    bits: Box<[u64; SAMPLER_BITS / 64]>,
    /// Where each run occurs in the values, for [`Sampler::occurrences`].
    places: Places,
}

/// The values and offsets at which each run of [`GRAM`] bytes occurs, and the values by
/// their beginnings.
pub(super) struct Places {
    /// For each run, where it occurs.
    runs: HashMap<u32, Run, BuildHasherDefault<RunHasher>>,
    /// Each a value's index and the offset of the run in it, grouped by run.
    at: Vec<(u32, u32)>,
    pub(super) starts: Starts,
}

/// The bytes of each of the two words a value's beginning is known by ([`Starts::key`]).
pub(super) const WORD: usize = 8;

/// The values by their beginnings: which could occur where the text begins a certain way.
pub(super) struct Starts {
    /// For each [`Starts::key`] of a value, the range of `begun` that lists the values with it.
    keys: HashMap<(u64, u64), (u32, u32), BuildHasherDefault<RunHasher>>,
    /// Values' indexes, grouped by their keys.
    begun: Vec<u32>,
    /// The shortest value's length, at least [`WORD`].
    shortest: usize,
}

impl Starts {
    /// `None` when a value is shorter than [`WORD`].
    pub(super) fn new(values: &[Vec<u8>]) -> Option<Starts> {
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
    pub(super) fn at(&self, bytes: &[u8], start: usize) -> &[u32] {
        let range = bytes.get(start..).and_then(|tail| self.keys.get(&self.key(tail)?));
        range.map_or(&[], |&(first, end)| &self.begun[first as usize..end as usize])
    }
}

/// Where a run occurs in the values.
#[derive(Clone, Copy)]
pub(super) enum Run {
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
    pub(super) fn new(values: &[Vec<u8>], stride: usize) -> Option<Places> {
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
pub(super) struct RunHasher(u64);

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
pub(super) const PLACES_COMPARED: u32 = 4;

/// The most offsets of a run in more places than [`PLACES_COMPARED`] at which it is looked
/// for by the values' beginnings ([`Run::Offsets`]).
pub(super) const OFFSETS_COMPARED: usize = 2;

/// The sampler's bitmap's size in bits: 128 KiB, about 256 bits for each run of 100 values of
/// 40 bytes, so that few positions of ordinary text find a bit set by chance.
pub(super) const SAMPLER_BITS: usize = 1 << 20;

impl Sampler {
    /// `None` when a value is shorter than [`SAMPLED_SHORTEST`] (or there are none).
    pub(super) fn new(values: &[Vec<u8>]) -> Option<Sampler> {
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
    pub(super) fn occurrences(
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
    pub(super) fn windows<'a>(&'a self, bytes: &'a [u8], longest: usize) -> impl Iterator<Item = (usize, usize)> + 'a {
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
pub(super) fn read_run(bytes: &[u8]) -> u32 {
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// A run's bit in the [`Sampler`]'s bitmap.
pub(super) fn hash(run: u32) -> usize {
    (run.wrapping_mul(0x9e37_79b1) >> (32 - SAMPLER_BITS.trailing_zeros())) as usize
}

/// The longest window (in longest values) whose occurrences are found by comparison rather
/// than by the automaton: a window that runs on is text full of values.
pub(super) const WINDOW_COMPARED: usize = 4;

/// How many sampled positions [`Hits`] looks up before it branches on what it found.
pub(super) const BLOCK: usize = 16;

/// The sampled positions whose bit is set, in order: looked up [`BLOCK`] at a time, without
/// a branch on each, so that the lookups overlap.
pub(super) struct Hits<'a> {
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
