//! Framing: one JSON-RPC message per line, bounded, and how to show a bad frame in an error.

use serde::Serialize;
use tokio_util::codec::AnyDelimiterCodec;

use crate::version::MAX_FRAME_BYTES;

/// A codec that splits a byte stream at newlines into frames of at most [`MAX_FRAME_BYTES`].
/// Frames are bytes, not text, so that a frame that is not UTF-8 can still be shown.
pub fn codec() -> AnyDelimiterCodec {
    AnyDelimiterCodec::new_with_max_length(b"\n".to_vec(), b"\n".to_vec(), MAX_FRAME_BYTES)
}

/// One message as a line: JSON with no raw newline (serde_json never writes one) and `\n`.
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    let mut line = serde_json::to_vec(message).unwrap_or_else(|error| {
        // Our message types always serialize; this keeps a bug visible rather than silent.
        format!(r#"{{"jsonrpc":"2.0","method":"log","params":{{"level":"error","message":"cannot encode a message: {error}"}}}}"#)
            .into_bytes()
    });
    line.push(b'\n');
    line
}

/// The first bytes of a frame, escaped for an error message.
pub fn first_bytes(frame: &[u8]) -> String {
    const SHOWN: usize = 64;
    let shown = &frame[..frame.len().min(SHOWN)];
    let mut text: String = shown.escape_ascii().to_string();
    if frame.len() > SHOWN {
        text.push_str("...");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_shown_escaped_and_cut() {
        assert_eq!(first_bytes(b"hello\x00\xff"), "hello\\x00\\xff");
        let long = vec![b'a'; 100];
        assert_eq!(first_bytes(&long), format!("{}...", "a".repeat(64)));
    }

    #[test]
    fn an_encoded_message_is_one_line() {
        let line = encode(&serde_json::json!({"text": "two\nlines"}));
        assert_eq!(line.iter().filter(|&&byte| byte == b'\n').count(), 1);
        assert_eq!(line.last(), Some(&b'\n'));
    }
}
