//! Protocol version constants: the wire's own numbers, never the crate's.

/// The version this crate speaks. Version 1 appeared with knotless-run 0.1.
pub const PROTOCOL_VERSION: u32 = 1;

/// Every version this crate can speak, newest first.
pub const SUPPORTED_VERSIONS: &[u32] = &[PROTOCOL_VERSION];

/// The longest frame (one JSON-RPC message and its newline) either side accepts.
pub const MAX_FRAME_BYTES: usize = 8 * 1024 * 1024;

/// The largest `data` payload, before base64, that an executor should put in one `output`
/// notification.
pub const MAX_OUTPUT_CHUNK: usize = 64 * 1024;

/// Picks the newest version both sides speak.
pub fn negotiate(offered: &[u32], supported: &[u32]) -> Option<u32> {
    supported.iter().copied().filter(|version| offered.contains(version)).max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_picks_the_newest_common_version() {
        assert_eq!(negotiate(&[1, 2, 3], &[1, 2]), Some(2));
        assert_eq!(negotiate(&[1], &[1, 2]), Some(1));
        assert_eq!(negotiate(&[3], &[1, 2]), None);
        assert_eq!(negotiate(&[], &[1]), None);
    }
}
