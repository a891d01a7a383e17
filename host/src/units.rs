//! Human-readable sizes and durations for the CLI and job files
//! (`"64MiB"`, `"1s"`, `"100ms"`).

use std::time::Duration;

/// Parses a byte size: a number with an optional `B`, `KiB`, `MiB` or `GiB`
/// suffix (also `K`/`KB`, `M`/`MB`, `G`/`GB`, meaning the same powers of two).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number: usize = digits.parse().map_err(|_| format!("`{text}` is not a size (e.g. 64MiB)"))?;
    let factor: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => return Err(format!("unknown size unit `{other}` in `{text}` (use B, KiB, MiB or GiB)")),
    };
    number.checked_mul(factor).ok_or_else(|| format!("`{text}` is too large"))
}

/// Parses a duration such as `1s`, `100ms` or `2m 30s`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| format!("`{text}` is not a duration (e.g. 1s, 100ms): {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("2 GiB"), Ok(2 << 30));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5XB").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert!(parse_duration("soon").is_err());
    }

    /// The API's schemas allow sizes matching
    /// `^[0-9]{1,9} ?([bB]|[kKmMgG]([iI]?[bB])?)?$` and durations of one to
    /// four parts matching `[0-9]{1,9} ?(ns|us|ms|s|m|h|d)`: the largest of
    /// each must parse, so a request valid under the schema never fails here.
    #[test]
    fn what_the_api_schemas_allow_parses() {
        for size in ["0", "999999999GiB", "1 kb", "5M", "7b"] {
            assert!(parse_size(size).is_ok(), "{size}");
        }
        for duration in ["0ns", "999999999d 999999999d 999999999d 999999999d", "1 h", "2m 30s"] {
            assert!(parse_duration(duration).is_ok(), "{duration}");
        }
    }
}
