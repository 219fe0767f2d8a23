//! A byte stream through a stdin that is never closed: length-prefixed frames that the remote
//! side reads with POSIX `sh` and `dd`, ended inside the stream itself.
//!
//! Some transports cannot end a remote command's stdin without ending the command's streams
//! and its exit code with it (a Kubernetes exec before 1.30, whose websocket protocol,
//! `v4.channel.k8s.io`, has no CLOSE signal: closing the websocket is the only end of stdin).
//! A command that reads its stdin to its end (`tar x`, which BusyBox's reads to the end of
//! the stream past the archive's end) then never ends. So the stream is framed
//! ([`FrameWriter`]): each frame is its length in decimal and a newline, then that many bytes;
//! `0\n` ends the stream whole, and a line that is no number (`cut\n`) ends it cut. The
//! remote side's [`UNFRAME`] copies the frames' bytes to its stdout and returns 0 at the end
//! of a whole stream, or 1 at a cut one, a malformed frame, or the end of its stdin; either
//! way it never reads past the stream's end, and its stdout ends there.
//!
//! `sh`'s `read` takes one byte at a time from a pipe, so it never reads into a frame's bytes;
//! a frame's bytes are read by one `dd` with a count in bytes that reads no more, however the
//! pipe splits them (`iflag=count_bytes,fullblock` in GNU and BusyBox `dd`; `count_bytes`
//! alone reads whole counts in toybox's, which has no `fullblock`).

use std::io::{self, Write};

/// The most bytes one frame holds: each frame costs the remote side one `dd`.
pub const FRAME: usize = 1 << 20;

/// The shell function `knotless_unframe` (see the module's documentation). POSIX `sh` and a
/// `dd` with `iflag=count_bytes`.
pub const UNFRAME: &str = crate::sdk::remote::unframe_function!();

/// Frames what is written to it into `inner` (see the module's documentation), [`FRAME`]
/// bytes at a time; [`FrameWriter::finish`] ends the stream whole, [`FrameWriter::cut`] cut.
pub struct FrameWriter<W: Write> {
    inner: W,
    buffer: Vec<u8>,
}

impl<W: Write> FrameWriter<W> {
    /// A framed stream into `inner`.
    pub fn new(inner: W) -> Self {
        Self { inner, buffer: Vec::with_capacity(FRAME) }
    }

    fn send_frame(&mut self) -> io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        self.inner.write_all(format!("{}\n", self.buffer.len()).as_bytes())?;
        self.inner.write_all(&self.buffer)?;
        self.buffer.clear();
        Ok(())
    }

    /// Sends what is buffered, then the end of a whole stream.
    pub fn finish(&mut self) -> io::Result<()> {
        self.send_frame()?;
        self.inner.write_all(b"0\n")?;
        self.inner.flush()
    }

    /// Ends the stream as cut: what is buffered is dropped, and the remote side fails.
    pub fn cut(&mut self) -> io::Result<()> {
        self.buffer.clear();
        self.inner.write_all(b"cut\n")?;
        self.inner.flush()
    }

    /// The stream it writes into.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }
}

impl<W: Write> Write for FrameWriter<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let room = FRAME - self.buffer.len();
        let taken = bytes.len().min(room);
        self.buffer.extend_from_slice(&bytes[..taken]);
        if self.buffer.len() == FRAME {
            self.send_frame()?;
        }
        Ok(taken)
    }

    /// Sends what is buffered as a frame.
    fn flush(&mut self) -> io::Result<()> {
        self.send_frame()?;
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    use super::*;

    /// Runs `knotless_unframe` with the host's `sh` and `dd` on `stream`, written in pieces
    /// of `piece` bytes with pauses between (so that `dd` sees short reads), and a stdin kept
    /// open afterwards: what it wrote, whether it succeeded, and the bytes it left unread.
    fn unframe(stream: &[u8], piece: usize) -> (Vec<u8>, bool, Vec<u8>) {
        let script = format!("{UNFRAME}knotless_unframe > \"$1\"; r=$?; echo $r > \"$1.rc\"; exec cat > \"$1.rest\"");
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let mut child =
            Command::new("sh").args(["-c", &script, "sh"]).arg(&out).stdin(Stdio::piped()).spawn().expect("sh");
        let mut stdin = child.stdin.take().expect("stdin");
        for chunk in stream.chunks(piece) {
            stdin.write_all(chunk).expect("write");
            stdin.flush().expect("flush");
            std::thread::sleep(Duration::from_millis(1));
        }
        // The stream's end is known before stdin closes: the result is there already.
        let rc = out.with_extension("rc");
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while std::fs::read_to_string(&rc).map_or(true, |text| !text.ends_with('\n')) {
            assert!(std::time::Instant::now() < until, "unframe ended without the end of its stdin");
            std::thread::sleep(Duration::from_millis(5));
        }
        stdin.write_all(b"after").expect("write");
        drop(stdin);
        assert!(child.wait().expect("wait").success());
        let mut written = Vec::new();
        std::fs::File::open(&out).expect("out").read_to_end(&mut written).expect("read");
        let ok = std::fs::read_to_string(&rc).expect("rc").trim() == "0";
        let rest = std::fs::read(out.with_extension("rest")).expect("rest");
        (written, ok, rest)
    }

    fn framed(data: &[u8], whole: bool) -> Vec<u8> {
        let mut writer = FrameWriter::new(Vec::new());
        // Writes of odd sizes, as a tar copy makes them.
        for chunk in data.chunks(7919) {
            writer.write_all(chunk).expect("write");
        }
        if whole { writer.finish() } else { writer.cut() }.expect("end");
        std::mem::take(writer.get_mut())
    }

    #[test]
    fn a_framed_stream_arrives_whole_and_ends_before_its_stdin_does() {
        let mut data = b"0\n12\n\n".to_vec();
        data.extend((0..(FRAME * 2 + 4321)).map(|index| (index * 31 % 251) as u8));
        let stream = framed(&data, true);
        for piece in [4096, 65_537] {
            let (written, ok, rest) = unframe(&stream, piece);
            assert!(ok, "a whole stream");
            assert!(written == data, "{} of {} bytes, whole", written.len(), data.len());
            assert_eq!(rest, b"after", "nothing read past its end");
        }
        let (written, ok, _) = unframe(&framed(b"", true), 4096);
        assert!(ok && written.is_empty());
    }

    #[test]
    fn a_cut_or_broken_stream_fails() {
        let data = vec![7u8; FRAME + 10];
        let (_, ok, rest) = unframe(&framed(&data, false), 65_536);
        assert!(!ok, "a cut stream fails");
        assert_eq!(rest, b"after");
        // A frame shorter than it says, then the end of stdin: not whole.
        let mut stream = framed(&data, true);
        stream.truncate(FRAME / 2);
        let mut child = Command::new("sh")
            .args(["-c", &format!("{UNFRAME}knotless_unframe > /dev/null")])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sh");
        child.stdin.take().expect("stdin").write_all(&stream).expect("write");
        let output = child.wait_with_output().expect("wait");
        assert!(!output.status.success());
        assert!(String::from_utf8_lossy(&output.stderr).contains("ended before its end"), "{output:?}");
    }
}
