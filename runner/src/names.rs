//! Stable names for files and folders: the same input gives the same name in every process and
//! every release, so a cache or a mirror made by one run is found by the next.

/// FNV-1a, 64 bits: a stable hash for names.
pub fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}
