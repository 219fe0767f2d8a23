//! Framing: one JSON-RPC message per line, bounded, and how to show a bad frame in an error.

use bytes::{Buf as _, Bytes, BytesMut};
use serde::Serialize;
use tokio_util::codec::Decoder;

use crate::version::MAX_FRAME_BYTES;

/// A codec that splits a byte stream at newlines into frames of at most [`MAX_FRAME_BYTES`].
/// Frames are bytes, not text, so that a frame that is not UTF-8 can still be shown.
pub fn codec() -> Frames {
    Frames::new(MAX_FRAME_BYTES)
}

/// Splits a byte stream at newlines, each byte searched once. A frame longer than the bound
/// is an error, and the bytes up to its end are dropped, so a reader may go on with the next
/// frame; bytes after the last newline at the end of the stream are a last frame.
#[derive(Debug)]
pub struct Frames {
    max: usize,
    /// How far the buffer was searched for a newline already.
    searched: usize,
    /// Dropping the rest of an overlong frame.
    discarding: bool,
}

impl Frames {
    /// Frames of at most `max` bytes (without their newline).
    pub fn new(max: usize) -> Frames {
        Frames { max, searched: 0, discarding: false }
    }

    fn overlong(&self) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, format!("a frame longer than {} bytes", self.max))
    }
}

impl Decoder for Frames {
    type Item = Bytes;
    type Error = std::io::Error;

    fn decode(&mut self, buffer: &mut BytesMut) -> Result<Option<Bytes>, std::io::Error> {
        loop {
            let Some(offset) = memchr::memchr(b'\n', &buffer[self.searched..]) else {
                if self.discarding {
                    buffer.clear();
                    self.searched = 0;
                } else if buffer.len() > self.max {
                    buffer.clear();
                    self.searched = 0;
                    self.discarding = true;
                    return Err(self.overlong());
                } else {
                    self.searched = buffer.len();
                }
                return Ok(None);
            };
            let end = self.searched + offset;
            self.searched = 0;
            if self.discarding {
                buffer.advance(end + 1);
                self.discarding = false;
                continue;
            }
            if end > self.max {
                buffer.advance(end + 1);
                return Err(self.overlong());
            }
            let frame = buffer.split_to(end + 1).freeze();
            return Ok(Some(frame.slice(..end)));
        }
    }

    fn decode_eof(&mut self, buffer: &mut BytesMut) -> Result<Option<Bytes>, std::io::Error> {
        if let Some(frame) = self.decode(buffer)? {
            return Ok(Some(frame));
        }
        self.searched = 0;
        if buffer.is_empty() || self.discarding {
            buffer.clear();
            return Ok(None);
        }
        Ok(Some(buffer.split().freeze()))
    }
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

    fn split(chunks: &[&[u8]], max: usize) -> Vec<Result<Vec<u8>, String>> {
        let mut codec = Frames::new(max);
        let mut buffer = BytesMut::new();
        let mut frames = Vec::new();
        for chunk in chunks {
            buffer.extend_from_slice(chunk);
            loop {
                match codec.decode(&mut buffer) {
                    Ok(Some(frame)) => frames.push(Ok(frame.to_vec())),
                    Ok(None) => break,
                    Err(error) => frames.push(Err(error.to_string())),
                }
            }
        }
        while let Ok(Some(frame)) = codec.decode_eof(&mut buffer) {
            frames.push(Ok(frame.to_vec()));
        }
        frames
    }

    #[test]
    fn frames_split_at_newlines_whatever_the_chunks_and_overlong_ones_are_skipped() {
        let ok = |text: &str| Ok(text.as_bytes().to_vec());
        assert_eq!(split(&[b"one\ntw", b"o\n\nthr", b"ee"], 8), [ok("one"), ok("two"), ok(""), ok("three")]);
        let too_long = Err("a frame longer than 4 bytes".to_string());
        // Overlong with its newline in view, and overlong before its newline came.
        assert_eq!(split(&[b"12345\nok\n"], 4), [too_long.clone(), ok("ok")]);
        assert_eq!(split(&[b"123", b"45", b"678", b"9\nok\nrest"], 4), [too_long, ok("ok"), ok("rest")]);
        assert_eq!(split(&[b"1234\n"], 4), [ok("1234")]);
        assert_eq!(split(&[b""], 4), []);
    }

    #[test]
    fn an_encoded_message_is_one_line() {
        let line = encode(&serde_json::json!({"text": "two\nlines"}));
        assert_eq!(line.iter().filter(|&&byte| byte == b'\n').count(), 1);
        assert_eq!(line.last(), Some(&b'\n'));
    }
}
