//! Human-readable sizes and durations: parsed from job files and the CLI
//! (`"64MiB"`, `"1s"`, `"100ms"`), and written for people (the CLI's
//! tables, the dashboard): `12.3k`, `3.5 MiB`, `12 ms`, `2 min`.

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

/// A count, short: 950, 12.3k, 4.1M.
pub fn count(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}

/// Bytes in binary units: 512 B, 3.5 MiB.
pub fn bytes(n: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{value:.0} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// A duration of work: 0.40 ms, 12 ms, 1.2 s.
pub fn work(s: f64) -> String {
    if s < 0.001 {
        format!("{:.2} ms", s * 1e3)
    } else if s < 1.0 {
        format!("{:.0} ms", s * 1e3)
    } else {
        format!("{s:.1} s")
    }
}

/// An age: 4 s, 3 min, 2.5 h.
pub fn age(s: f64) -> String {
    if s < 60.0 {
        format!("{s:.0} s")
    } else if s < 3600.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

/// A time of day, UTC, from ms since the Unix epoch: `20:40:04 UTC`.
pub fn clock(ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    let text = humantime::format_rfc3339_seconds(at).to_string();
    // 2025-12-03T20:40:04Z -> 20:40:04 UTC
    text.get(11..19).map_or(text.clone(), |t| format!("{t} UTC"))
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
    fn figures_read_as_people_write_them() {
        assert_eq!(count(950), "950");
        assert_eq!(count(12_345), "12.3k");
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(3.5 * 1024.0 * 1024.0), "3.5 MiB");
        assert_eq!(work(0.012), "12 ms");
        assert_eq!(age(125.0), "2 min");
        // 2025-12-03T20:40:04Z
        assert_eq!(clock(1_764_794_404_000), "20:40:04 UTC");
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
