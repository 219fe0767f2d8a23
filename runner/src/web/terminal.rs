//! A line of a step's output as a terminal would colour it: ANSI SGR sequences (colours, bold,
//! dim, italic, underline) become styled spans, read by `anstyle-parse` (the parser of
//! `anstream`), and every other control sequence or character is shown escaped as the plain
//! log shows it (`\x1b[2J`, `\r`), never hidden and never acted on. Colours are classes of the
//! page's stylesheet (its Content-Security-Policy allows no inline style): the 16 colours as
//! they are, 256-colour and true-colour ones as the nearest of the 16.

use anstyle_parse::{DefaultCharAccumulator, Params, Parser, Perform};
use maud::{Markup, html};

use crate::printable;

/// How a run of text is drawn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Style {
    bold: bool,
    dim: bool,
    italic: bool,
    underline: bool,
    /// One of the 16 colours.
    fg: Option<u8>,
    bg: Option<u8>,
}

impl Style {
    /// The classes of the stylesheet that draw it (`b`, `d`, `i`, `u`, `fN`, `gN`); empty for
    /// plain text.
    pub fn classes(&self) -> String {
        let mut classes = Vec::new();
        for (on, class) in [(self.bold, "b"), (self.dim, "d"), (self.italic, "i"), (self.underline, "u")] {
            if on {
                classes.push(class.to_string());
            }
        }
        if let Some(fg) = self.fg {
            classes.push(format!("f{fg}"));
        }
        if let Some(bg) = self.bg {
            classes.push(format!("g{bg}"));
        }
        classes.join(" ")
    }

    /// Applies one SGR sequence's parameters.
    fn apply(&mut self, params: &Params) {
        let mut params = params.iter().peekable();
        if params.peek().is_none() {
            *self = Style::default();
        }
        while let Some(param) = params.next() {
            let code = param.first().copied().unwrap_or(0);
            match code {
                0 => *self = Style::default(),
                1 => self.bold = true,
                2 => self.dim = true,
                3 => self.italic = true,
                4 => self.underline = true,
                22 => (self.bold, self.dim) = (false, false),
                23 => self.italic = false,
                24 => self.underline = false,
                30..=37 => self.fg = Some((code - 30) as u8),
                39 => self.fg = None,
                40..=47 => self.bg = Some((code - 40) as u8),
                49 => self.bg = None,
                90..=97 => self.fg = Some((code - 90 + 8) as u8),
                100..=107 => self.bg = Some((code - 100 + 8) as u8),
                38 | 48 => {
                    // `38;5;N` or `38;2;R;G;B`, as separate parameters or `:` subparameters.
                    let rest: Vec<u16> = if param.len() > 1 {
                        param[1..].to_vec()
                    } else {
                        let kind = params.next().and_then(|p| p.first().copied());
                        let count = match kind {
                            Some(5) => 1,
                            Some(2) => 3,
                            _ => 0,
                        };
                        kind.into_iter().chain((0..count).filter_map(|_| params.next()?.first().copied())).collect()
                    };
                    let colour = match rest.as_slice() {
                        [5, n, ..] => Some(from_256(*n)),
                        [2, r, g, b] | [2, _, r, g, b] => Some(nearest([*r, *g, *b])),
                        _ => None,
                    };
                    if code == 38 {
                        self.fg = colour.or(self.fg);
                    } else {
                        self.bg = colour.or(self.bg);
                    }
                }
                _ => {}
            }
        }
    }
}

/// The 16 colours as xterm draws them.
const PALETTE: [[u16; 3]; 16] = [
    [0, 0, 0],
    [205, 0, 0],
    [0, 205, 0],
    [205, 205, 0],
    [0, 0, 238],
    [205, 0, 205],
    [0, 205, 205],
    [229, 229, 229],
    [127, 127, 127],
    [255, 0, 0],
    [0, 255, 0],
    [255, 255, 0],
    [92, 92, 255],
    [255, 0, 255],
    [0, 255, 255],
    [255, 255, 255],
];

/// The nearest of the 16 colours to an RGB colour.
fn nearest(rgb: [u16; 3]) -> u8 {
    let distance = |colour: &[u16; 3]| -> i64 {
        colour.iter().zip(rgb).map(|(a, b)| (i64::from(*a) - i64::from(b.min(255))).pow(2)).sum()
    };
    (0..16u8).min_by_key(|index| distance(&PALETTE[usize::from(*index)])).unwrap_or(7)
}

/// One of the 256 colours as the nearest of the 16.
fn from_256(n: u16) -> u8 {
    match n {
        0..=15 => n as u8,
        16..=231 => {
            let n = n - 16;
            let level = |step: u16| if step == 0 { 0 } else { 55 + step * 40 };
            nearest([level(n / 36), level(n / 6 % 6), level(n % 6)])
        }
        _ => {
            let gray = 8 + 10 * (n.min(255) - 232);
            nearest([gray, gray, gray])
        }
    }
}

/// Collects a line's runs of text and their styles.
struct Spans {
    style: Style,
    spans: Vec<(Style, String)>,
    /// The bytes fed since the parser last acted: what a sequence it does not draw held.
    raw: Vec<u8>,
}

impl Spans {
    fn push(&mut self, text: &str) {
        match self.spans.last_mut() {
            Some((style, run)) if *style == self.style => run.push_str(text),
            _ => self.spans.push((self.style, text.to_string())),
        }
    }

    /// Shows the bytes fed since the parser last acted, escaped.
    fn show_raw(&mut self) {
        let raw = std::mem::take(&mut self.raw);
        let text = String::from_utf8_lossy(&raw).into_owned();
        self.push(&printable::line(&text));
    }
}

impl Perform for Spans {
    fn print(&mut self, c: char) {
        let mut buffer = [0u8; 4];
        if self.raw.as_slice() == c.encode_utf8(&mut buffer).as_bytes() {
            self.raw.clear();
            self.push(&printable::line(c.encode_utf8(&mut buffer)));
        } else {
            // Bytes the parser dropped come before it: shown with it.
            self.show_raw();
        }
    }

    fn execute(&mut self, _byte: u8) {
        self.show_raw();
    }

    fn csi_dispatch(&mut self, params: &Params, intermediates: &[u8], ignore: bool, action: u8) {
        if action == b'm' && intermediates.is_empty() && !ignore {
            self.raw.clear();
            self.style.apply(params);
        } else {
            self.show_raw();
        }
    }

    fn esc_dispatch(&mut self, _intermediates: &[u8], _ignore: bool, _byte: u8) {
        self.show_raw();
    }

    fn osc_dispatch(&mut self, _params: &[&[u8]], _bell_terminated: bool) {
        self.show_raw();
    }

    fn unhook(&mut self) {
        self.show_raw();
    }
}

/// The runs of `line` with their styles, starting in `style`, and the style it ends in.
pub fn spans(line: &str, style: Style) -> (Vec<(Style, String)>, Style) {
    let mut parser = Parser::<DefaultCharAccumulator>::new();
    let mut spans = Spans { style, spans: Vec::new(), raw: Vec::new() };
    for byte in line.bytes() {
        spans.raw.push(byte);
        parser.advance(&mut spans, byte);
    }
    // A sequence the line ended inside is shown as it was.
    if !spans.raw.is_empty() {
        spans.show_raw();
    }
    let end = spans.style;
    (spans.spans, end)
}

/// Styled runs as markup.
pub fn markup(runs: &[(Style, String)]) -> Markup {
    html! {
        @for (style, text) in runs {
            @if *style == Style::default() { (text) } @else { span class=(style.classes()) { (text) } }
        }
    }
}

/// `line` as styled spans, starting in `style`; gives the style it ends in (a colour set on one
/// line holds on the next, as in a terminal).
#[cfg(test)]
pub fn render(line: &str, style: &mut Style) -> Markup {
    let (runs, end) = spans(line, *style);
    *style = end;
    markup(&runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(line: &str) -> String {
        render(line, &mut Style::default()).into_string()
    }

    #[test]
    fn colours_and_bold_become_classes_and_nothing_of_the_sequence_shows() {
        assert_eq!(shown("\x1b[32m12:11:17 tick 10\x1b[0m"), "<span class=\"f2\">12:11:17 tick 10</span>");
        assert_eq!(shown("\x1b[1;31merror\x1b[0m: x"), "<span class=\"b f1\">error</span>: x");
        assert_eq!(shown("\x1b[1m\x1b[91merror"), "<span class=\"b f9\">error</span>");
        assert_eq!(
            shown("\x1b[38;5;196mred\x1b[39m \x1b[38;2;0;0;250mblue"),
            "<span class=\"f9\">red</span> <span class=\"f4\">blue</span>"
        );
        assert_eq!(shown("\x1b[38:5:34mgreen\x1b[m"), "<span class=\"f2\">green</span>");
        assert_eq!(
            shown("\x1b[44;97mon blue\x1b[49m!"),
            "<span class=\"f15 g4\">on blue</span><span class=\"f15\">!</span>"
        );
    }

    #[test]
    fn every_other_control_is_shown_escaped_and_markup_stays_text() {
        assert_eq!(shown("one\x1b[2Jtwo\r"), "one\\x1b[2Jtwo\\r");
        assert_eq!(shown("a\tb\x07"), "a\tb\\x07");
        assert_eq!(shown("\x1b]0;title\x07after"), "\\x1b]0;title\\x07after");
        assert_eq!(shown("\x1b(B\x1b[m"), "\\x1b(B");
        assert_eq!(shown("<script>&</script>"), "&lt;script&gt;&amp;&lt;/script&gt;");
        assert_eq!(shown("\x1b[31m<b>"), "<span class=\"f1\">&lt;b&gt;</span>");
        // A sequence cut by the end of the line is shown, not swallowed.
        assert_eq!(shown("cut \x1b[31"), "cut \\x1b[31");
        assert_eq!(shown("osc \x1b]8;;http://x"), "osc \\x1b]8;;http://x");
        assert_eq!(shown("c1 \u{9b}31m"), "c1 \\u{9b}31m");
    }

    #[test]
    fn a_style_carries_over_to_the_next_line() {
        let mut style = Style::default();
        let first = render("\x1b[33mwarn", &mut style).into_string();
        let second = render("still\x1b[0m plain", &mut style).into_string();
        assert_eq!(first, "<span class=\"f3\">warn</span>");
        assert_eq!(second, "<span class=\"f3\">still</span> plain");
        assert_eq!(style, Style::default());
    }

    proptest::proptest! {
        /// Whatever the line, every character of its text is shown (escaped or not), and
        /// nothing shown is a control character but a tab.
        #[test]
        fn nothing_is_hidden_and_no_control_reaches_the_page(line in "[a-z\\x1b\\[\\];0-9m\\x07\\r\\t\u{9b}<>&]{0,40}") {
            let (runs, _) = spans(&line, Style::default());
            let text: String = runs.iter().map(|(_, run)| run.as_str()).collect();
            proptest::prop_assert!(!text.chars().any(|c| c.is_control() && c != '\t'), "{text:?}");
            for letter in line.chars().filter(|c| c.is_ascii_alphabetic() && *c != 'm') {
                proptest::prop_assert!(text.contains(letter), "{line:?} lost {letter:?}: {text:?}");
            }
        }
    }
}
