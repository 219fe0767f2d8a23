//! Kubernetes resource quantities (`500m`, `2`, `512Mi`, `1.5Gi`), as a workflow's `resources`
//! and an executor's options give them, read into numbers an executor can compare and pass on
//! (`docker run --cpus` and `--memory`, a pod's requests and limits).

use crate::error::ExecutorError;

/// A CPU quantity as `--cpus` takes it: `500m` is `0.5`, `2` is `2`.
pub fn cpus(quantity: &str) -> Result<String, ExecutorError> {
    let bad = || {
        ExecutorError::configuration(format!("cpu request {quantity:?} is not a Kubernetes quantity such as 500m or 2"))
    };
    let text = quantity.trim();
    let (number, scale) = match text.strip_suffix('m') {
        Some(millis) => (millis, 1000.0),
        None => (text, 1.0),
    };
    if number.is_empty() || !number.chars().all(|char| char.is_ascii_digit() || char == '.') {
        return Err(bad());
    }
    let value: f64 = number.parse().map_err(|_| bad())?;
    let cores = value / scale;
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
    let text = quantity.trim();
    let split = text.find(|char: char| !(char.is_ascii_digit() || char == '.')).unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let multiplier: f64 = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "Pi" => 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "Ei" => 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "m" => 1e-3,
        _ => return Err(bad()),
    };
    if number.is_empty() {
        return Err(bad());
    }
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
