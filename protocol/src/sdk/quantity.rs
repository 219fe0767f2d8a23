//! Kubernetes resource quantities (`500m`, `2`, `512Mi`, `1.5Gi`), as a workflow's `resources`
//! and an executor's options give them, read into numbers an executor can compare and pass on
//! (`docker run --cpus` and `--memory`, a pod's requests and limits).

use crate::error::ExecutorError;

/// A Kubernetes quantity, read: its decimal number as written and what its suffix multiplies
/// it by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quantity<'a> {
    /// The decimal number: digits with at most one `.` (no sign: no resource is negative).
    pub number: &'a str,
    /// What the suffix multiplies the number by: `m` 0.001, `k` 1000, `Mi` 1048576, `e3` 1000.
    pub multiplier: f64,
    /// Whether the suffix is binary (`Ki` to `Ei`).
    pub binary: bool,
}

/// Reads `text` as Kubernetes serializes a quantity: a decimal number, then a binary suffix
/// (`Ki`, `Mi`, `Gi`, `Ti`, `Pi`, `Ei`), a decimal one (`m`, `k`, `M`, `G`, `T`, `P`, `E`), an
/// exponent (`e3`, `E-2`) or none; `None` when it is not one. The one reading of quantities:
/// the runner checks a workflow's `resources` with it, executors read them into numbers.
pub fn parse(text: &str) -> Option<Quantity<'_>> {
    let split = text.find(|char: char| !(char.is_ascii_digit() || char == '.')).unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    if !number.bytes().any(|byte| byte.is_ascii_digit()) || number.matches('.').count() > 1 {
        return None;
    }
    let binary = |power: i32| Some((1024f64.powi(power), true));
    let decimal = |power: i32| Some((10f64.powi(power), false));
    let (multiplier, binary) = match suffix {
        "" => decimal(0),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        exponent => {
            let digits = exponent.strip_prefix(['e', 'E'])?;
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.bytes().all(|byte| byte.is_ascii_digit()) {
                return None;
            }
            decimal(digits.parse().ok()?)
        }
    }?;
    Some(Quantity { number, multiplier, binary })
}

/// A CPU quantity as `--cpus` takes it: `500m` is `0.5`, `2` is `2` (a binary suffix is no
/// CPU count).
pub fn cpus(quantity: &str) -> Result<String, ExecutorError> {
    let bad = || {
        ExecutorError::configuration(format!("cpu request {quantity:?} is not a Kubernetes quantity such as 500m or 2"))
    };
    let read = parse(quantity.trim()).filter(|read| !read.binary).ok_or_else(bad)?;
    let value: f64 = read.number.parse().map_err(|_| bad())?;
    let cores = value * read.multiplier;
    if cores.is_nan() || cores <= 0.0 || !cores.is_finite() {
        return Err(bad());
    }
    let shown = format!("{cores:.3}");
    let shown = shown.trim_end_matches('0').trim_end_matches('.');
    if shown == "0" {
        return Err(bad());
    }
    Ok(shown.to_string())
}

/// A memory quantity in bytes: `512Mi` is 536870912, `1G` is 1000000000, `128974848` is
/// itself.
pub fn memory_bytes(quantity: &str) -> Result<u64, ExecutorError> {
    let bad = || {
        ExecutorError::configuration(format!(
            "memory request {quantity:?} is not a Kubernetes quantity such as 512Mi or 2Gi"
        ))
    };
    let Quantity { number, multiplier, .. } = parse(quantity.trim()).ok_or_else(bad)?;
    // Whole numbers are exact; fractions go through floating point and round up.
    if let (Ok(whole), true) = (number.parse::<u64>(), multiplier >= 1.0 && multiplier.fract() == 0.0) {
        return whole.checked_mul(multiplier as u64).filter(|bytes| *bytes > 0).ok_or_else(bad);
    }
    let value: f64 = number.parse().map_err(|_| bad())?;
    let bytes = (value * multiplier).ceil();
    if bytes.is_nan() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_kubernetes_writes_them() {
        for (text, multiplier) in [("2", 1.0), ("500m", 1e-3), ("4Gi", 1073741824.0), ("1e3", 1e3), ("1.5E-2", 1e-2)] {
            let read = parse(text).expect(text);
            assert_eq!(read.multiplier, multiplier, "{text}");
        }
        for bad in ["", "Mi", "4GB", "1..5", "-1", "1e", "1e+", "12Q", "m"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn cpu_quantities() {
        for (quantity, expected) in
            [("500m", "0.5"), ("2", "2"), ("1.5", "1.5"), ("250m", "0.25"), ("1000m", "1"), ("100m", "0.1")]
        {
            assert_eq!(cpus(quantity).expect(quantity), expected, "{quantity}");
        }
        for bad in ["", "m", "-1", "0", "abc", "1Gi", "0.0001"] {
            assert!(cpus(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn memory_quantities() {
        for (quantity, expected) in [
            ("512Mi", 536_870_912),
            ("1Gi", 1_073_741_824),
            ("1G", 1_000_000_000),
            ("128974848", 128_974_848),
            ("1.5Gi", 1_610_612_736),
            ("64Ki", 65_536),
            ("129e", 0),
        ] {
            if expected == 0 {
                assert!(memory_bytes(quantity).is_err(), "{quantity}");
            } else {
                assert_eq!(memory_bytes(quantity).expect(quantity), expected, "{quantity}");
            }
        }
        for bad in ["", "Mi", "12Q", "-5Mi", "0"] {
            assert!(memory_bytes(bad).is_err(), "{bad:?}");
        }
    }
}
