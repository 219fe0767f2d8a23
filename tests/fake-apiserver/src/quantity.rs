//! Resource quantities: the grammar of `resource.Quantity`
//! (staging/src/k8s.io/apimachinery/pkg/api/resource/quantity.go, `ParseQuantity`):
//!
//! ```text
//! <quantity>        ::= <signedNumber><suffix>
//! <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
//! <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
//! <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
//! <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
//! <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>
//! ```
//!
//! A value that does not parse fails decoding with `ErrFormatWrong`'s text (the API server
//! answers it as a 400 "cannot be handled as" error, see `strict.rs`).

/// `resource.ErrFormatWrong`'s message.
pub const FORMAT_WRONG: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// The value of a quantity (cores for CPU, bytes for memory), or `None` if it does not parse.
pub fn parse(text: &str) -> Option<f64> {
    let text = text.trim();
    let (sign, body) = match text.as_bytes().first()? {
        b'+' => (1.0, &text[1..]),
        b'-' => (-1.0, &text[1..]),
        _ => (1.0, text),
    };
    let number_len = body.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(body.len());
    let number = &body[..number_len];
    let suffix = &body[number_len..];
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return None;
    }
    let value: f64 = if number.starts_with('.') {
        format!("0{number}").parse().ok()?
    } else {
        number.trim_end_matches('.').parse().ok()?
    };
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exponent if exponent.starts_with(['e', 'E']) => {
            let digits = &exponent[1..];
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            10f64.powi(digits.parse().ok()?)
        }
        _ => return None,
    };
    Some(sign * value * scale)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn grammar() {
        assert_eq!(parse("500m"), Some(0.5));
        assert_eq!(parse("2"), Some(2.0));
        assert_eq!(parse("1Gi"), Some(1073741824.0));
        assert_eq!(parse("1e3"), Some(1000.0));
        assert_eq!(parse(".5"), Some(0.5));
        assert_eq!(parse("5."), Some(5.0));
        for bad in ["2 cores", "lots", "", "1.2.3", "1Gb", "m", "1e", "--1"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
