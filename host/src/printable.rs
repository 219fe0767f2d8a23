//! Text made safe for a terminal: names, causes and step output shown to people never carry a
//! raw control character (a newline that forges a runner line, an escape that recolours the
//! terminal); stored logs and records keep the bytes, and only what is printed is escaped.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `text` with every control character written as an escape (`\n`, `\r`, `\t`, `\x1b`,
/// `\u{9b}`), for a name or a one-line message.
pub fn name(text: &str) -> Cow<'_, str> {
    escape(text, false)
}

/// A size in bytes: `512 B`, `3.4 KiB`, `1.2 MiB`.
pub fn size(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} B"),
        1024..1_048_576 => format!("{:.1} KiB", bytes as f64 / 1024.0),
        1_048_576..1_073_741_824 => format!("{:.1} MiB", bytes as f64 / 1_048_576.0),
        _ => format!("{:.1} GiB", bytes as f64 / 1_073_741_824.0),
    }
}

/// A duration as people read it: `250 ms`, `19.7 s`, `30 s`, `300 s`; never Rust's debug
/// form (`19.746319455s`).
pub fn duration(duration: std::time::Duration) -> String {
    let millis = duration.as_millis();
    match millis {
        0..1000 => format!("{millis} ms"),
        _ if millis.is_multiple_of(1000) || millis >= 60_000 => format!("{} s", (millis + 500) / 1000),
        _ => format!("{:.1} s", duration.as_secs_f64()),
    }
}

/// A line of step output: like [`name`], but a tab stays a tab.
pub fn line(text: &str) -> Cow<'_, str> {
    escape(text, true)
}

/// A line of step output for a colour terminal: its colour and style sequences (SGR,
/// `ESC [ digits ; ... m`) kept, every other control character escaped as [`line`] does (a
/// cursor move, a title, a screen clear, a newline or carriage return never act), and the style
/// reset at its end when it set one, so nothing it set reaches the next line.
pub fn coloured_line(text: &str) -> Cow<'_, str> {
    if is_plain(text.as_bytes(), true) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 8);
    let mut rest = text;
    let mut styled = false;
    while let Some(at) = rest.find('\u{1b}') {
        shown.push_str(&line(&rest[..at]));
        rest = &rest[at..];
        match sgr_len(rest) {
            Some(len) => {
                shown.push_str(&rest[..len]);
                styled = true;
                rest = &rest[len..];
            }
            None => {
                shown.push_str("\\x1b");
                rest = &rest[1..];
            }
        }
    }
    shown.push_str(&line(rest));
    if styled {
        shown.push_str("\u{1b}[0m");
    }
    Cow::Owned(shown)
}

/// The length of the SGR sequence `text` starts with, if it starts with one: `ESC [`, at most
/// 64 digits, `;` and `:`, then `m`.
fn sgr_len(text: &str) -> Option<usize> {
    let params = text.strip_prefix("\u{1b}[")?;
    let digits =
        params.bytes().take(65).take_while(|byte| byte.is_ascii_digit() || *byte == b';' || *byte == b':').count();
    (digits <= 64 && params.as_bytes().get(digits) == Some(&b'm')).then_some(2 + digits + 1)
}

fn escape(text: &str, keep_tabs: bool) -> Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && !(keep_tabs && c == '\t');
    if is_plain(text.as_bytes(), keep_tabs) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if !unsafe_char(c) => escaped.push(c),
            '\n' => escaped.push_str("\\n"),
            '\r' => escaped.push_str("\\r"),
            '\t' => escaped.push_str("\\t"),
            c if (c as u32) < 0x80 => {
                let _ = write!(escaped, "\\x{:02x}", c as u32);
            }
            c => {
                let _ = write!(escaped, "\\u{{{:x}}}", c as u32);
            }
        }
    }
    Cow::Owned(escaped)
}

/// Whether `bytes` (UTF-8) hold no control character: no byte below 0x20 but a kept tab, no
/// DEL, and no C1 control (U+0080 to U+009F, which UTF-8 writes as 0xC2 0x80 to 0xC2 0x9F).
/// Byte by byte, without decoding: the check every printed line of step output takes.
fn is_plain(bytes: &[u8], keep_tabs: bool) -> bool {
    // Printable ASCII, 32 bytes at a time with no early exit, so that it vectorizes; the exact
    // check below runs only for text with tabs, other controls or non-ASCII.
    let printable_ascii = |chunk: &[u8]| chunk.iter().fold(true, |plain, &byte| plain & (0x20..0x7f).contains(&byte));
    let mut chunks = bytes.chunks_exact(32);
    if chunks.by_ref().all(printable_ascii) && printable_ascii(chunks.remainder()) {
        return true;
    }
    let mut previous = 0u8;
    for &byte in bytes {
        let control = byte < 0x20 && !(keep_tabs && byte == b'\t');
        if control || byte == 0x7f || (previous == 0xc2 && (0x80..0xa0).contains(&byte)) {
            return false;
        }
        previous = byte;
    }
    true
}

/// Bytes of a stored log, for a terminal: lines kept, every other control byte escaped, and
/// invalid UTF-8 shown as U+FFFD. A line cut at the end of `bytes` stays unterminated.
pub fn log(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut shown = String::with_capacity(text.len());
    for (index, part) in text.split('\n').enumerate() {
        if index > 0 {
            shown.push('\n');
        }
        shown.push_str(&line(part));
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        use std::time::Duration;
        for (given, shown) in [
            (Duration::from_millis(250), "250 ms"),
            (Duration::from_nanos(19_746_319_455), "19.7 s"),
            (Duration::from_secs(30), "30 s"),
            (Duration::from_millis(299_600), "300 s"),
            (Duration::ZERO, "0 ms"),
        ] {
            assert_eq!(duration(given), shown, "{given:?}");
        }
    }

    #[test]
    fn control_characters_are_escaped_and_nothing_else_changes() {
        assert_eq!(name("evil\nfake ==> success\u{1b}[31m"), "evil\\nfake ==> success\\x1b[31m");
        assert_eq!(name("tab\there\r"), "tab\\there\\r");
        assert_eq!(name("csi\u{9b}31m del\u{7f}"), "csi\\u{9b}31m del\\x7f");
        assert_eq!(line("a\tb\u{7}"), "a\tb\\x07");
        assert!(matches!(name("ünïcode -dash"), Cow::Borrowed("ünïcode -dash")));
        assert!(matches!(line("a\tb"), Cow::Borrowed("a\tb")));
        // U+0100 is 0xC4 0x80: a continuation byte in the C1 range after another lead is plain.
        assert!(matches!(name("\u{100}\u{c0}"), Cow::Borrowed(_)));
        assert_eq!(name("x\u{85}\u{9f}"), "x\\u{85}\\u{9f}");
        assert_eq!(log(b"one\x1b[2J\ntwo\r\n\xff"), "one\\x1b[2J\ntwo\\r\n\u{fffd}");
    }

    #[test]
    fn a_colour_terminal_gets_colours_and_nothing_else_raw() {
        assert_eq!(coloured_line("plain\ttext"), "plain\ttext");
        assert_eq!(coloured_line("\u{1b}[1;31merror\u{1b}[0m: x"), "\u{1b}[1;31merror\u{1b}[0m: x\u{1b}[0m");
        assert_eq!(coloured_line("\u{1b}[38:5:208mo"), "\u{1b}[38:5:208mo\u{1b}[0m");
        // What is not a colour shows as the plain log shows it.
        assert_eq!(coloured_line("a\u{1b}[2Jb\u{1b}[31"), "a\\x1b[2Jb\\x1b[31");
        assert_eq!(coloured_line("\u{1b}]0;title\u{7}\u{1b}(B\u{1b}[m"), "\\x1b]0;title\\x07\\x1b(B\u{1b}[m\u{1b}[0m");
        assert_eq!(coloured_line("fake\r==> success"), "fake\\r==> success");
        assert_eq!(coloured_line(&format!("\u{1b}[{}m", "1;".repeat(40))), format!("\\x1b[{}m", "1;".repeat(40)));
    }

    proptest::proptest! {
        /// Only whole colour sequences reach a colour terminal raw, and the line ends plain.
        #[test]
        fn a_coloured_line_holds_no_control_but_whole_colours(text in "(?s).*|[\\x00-\\x{ff}\\x1b\\[;m0-9]*") {
            let shown = coloured_line(&text);
            let mut rest = shown.as_ref();
            let mut styled = false;
            while let Some(at) = rest.find(|c: char| c.is_control() && c != '\t') {
                let len = sgr_len(&rest[at..]);
                proptest::prop_assert!(len.is_some(), "a raw control in {:?}", shown);
                styled = true;
                rest = &rest[at + len.unwrap_or(1)..];
            }
            proptest::prop_assert!(!styled || shown.ends_with("\u{1b}[0m"), "{:?}", shown);
        }

        /// The byte check agrees with decoding every character.
        #[test]
        fn the_byte_check_agrees_with_the_characters(text in "(?s).*|[\\x00-\\x{ff}]*", keep_tabs: bool) {
            let control = text.chars().any(|c| c.is_control() && !(keep_tabs && c == '\t'));
            proptest::prop_assert_eq!(is_plain(text.as_bytes(), keep_tabs), !control);
        }
    }
}
