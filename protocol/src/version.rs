//! Protocol version constants: the wire's own numbers, never the crate's.

/// The version this crate speaks. Version 1 appeared with knotless-run 0.1.
pub const PROTOCOL_VERSION: u32 = 1;

/// Every version this crate can speak, newest first.
pub const SUPPORTED_VERSIONS: &[u32] = &[PROTOCOL_VERSION];

/// The protocol versions this crate speaks, as text (`1`; later `2, 1`), for a program's
/// `--version`: a macro, so that `concat!` can put it in a constant. A test keeps it equal to
/// [`SUPPORTED_VERSIONS`].
#[macro_export]
macro_rules! protocol_versions {
    () => {
        "1"
    };
}

/// What a program's `--version` says after its name: its own version and the protocol
/// versions it speaks, `0.2.0 (protocol 1)`. Its own version is the calling package's.
#[macro_export]
macro_rules! version_line {
    () => {
        concat!(env!("CARGO_PKG_VERSION"), " (protocol ", $crate::protocol_versions!(), ")")
    };
}

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
    fn the_versions_text_names_every_supported_version() {
        let listed: Vec<String> = SUPPORTED_VERSIONS.iter().map(u32::to_string).collect();
        assert_eq!(crate::protocol_versions!(), listed.join(", "));
        assert_eq!(crate::version_line!(), format!("{} (protocol 1)", env!("CARGO_PKG_VERSION")));
    }

    #[test]
    fn negotiation_picks_the_newest_common_version() {
        assert_eq!(negotiate(&[1, 2, 3], &[1, 2]), Some(2));
        assert_eq!(negotiate(&[1], &[1, 2]), Some(1));
        assert_eq!(negotiate(&[3], &[1, 2]), None);
        assert_eq!(negotiate(&[], &[1]), None);
    }
}
