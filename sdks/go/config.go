package sluice

// Configuration and logging.

import (
	"fmt"
	"math"
	"math/big"
	"strings"
	"time"
)

// Config is the job's transform configuration: string pairs in the job's
// order. When a key repeats, the last value wins.
type Config struct {
	entries [][2]string
}

func newConfig(entries [][2]string) *Config {
	return &Config{entries: entries}
}

// NewConfig returns a configuration of name, value pairs (for tests; the
// host's comes to the function given to [Export]).
func NewConfig(pairs ...[2]string) *Config { return newConfig(pairs) }

// Get returns the value of setting name.
func (c *Config) Get(name string) (string, bool) {
	value, found := "", false
	for _, e := range c.entries {
		if e[0] == name {
			value, found = e[1], true
		}
	}
	return value, found
}

// GetOr returns the value of setting name, or def when it is not set.
func (c *Config) GetOr(name, def string) string {
	if v, ok := c.Get(name); ok {
		return v
	}
	return def
}

// Require returns the value of setting name, or an error if it is missing.
func (c *Config) Require(name string) (string, error) {
	if v, ok := c.Get(name); ok {
		return v, nil
	}
	return "", fmt.Errorf("missing required config key `%s`", name)
}

// Len returns the number of settings (repeats included).
func (c *Config) Len() int { return len(c.entries) }

// Choice returns the value of setting name if it is one of allowed, def
// when it is not set, and an error naming the key otherwise.
func (c *Config) Choice(name string, allowed []string, def string) (string, error) {
	v, ok := c.Get(name)
	if !ok {
		return def, nil
	}
	for _, a := range allowed {
		if v == a {
			return v, nil
		}
	}
	names := make([]string, len(allowed))
	for i, a := range allowed {
		names[i] = "`" + a + "`"
	}
	return "", fmt.Errorf("config key `%s`: unknown value %q; expected one of %s", name, v, strings.Join(names, ", "))
}

// DurationMs returns setting name as a duration such as `10s`, `1m 30s`,
// `500ms` or `2h` (the job files' notation, humantime's, as the Rust SDK's
// Config::duration and the Python SDK's duration_ms read it), in whole
// milliseconds (rounded down, at most math.MaxInt64); def when it is not
// set, an error naming the key and the value when it does not parse.
func (c *Config) DurationMs(name string, def int64) (int64, error) {
	raw, ok := c.Get(name)
	if !ok {
		return def, nil
	}
	ms, err := ParseDurationMs(strings.TrimSpace(raw))
	if err != nil {
		return 0, fmt.Errorf("config key `%s`: invalid duration %q (e.g. 10s, 1m, 500ms): %w", name, raw, err)
	}
	return ms, nil
}

// Duration is [Config.DurationMs] as a time.Duration (whole milliseconds;
// a duration beyond time.Duration's ~292 years is an error).
func (c *Config) Duration(name string, def time.Duration) (time.Duration, error) {
	raw, ok := c.Get(name)
	if !ok {
		return def, nil
	}
	ms, err := c.DurationMs(name, 0)
	if err != nil {
		return 0, err
	}
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return 0, fmt.Errorf("config key `%s`: invalid duration %q: too large for a Go time.Duration", name, raw)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

var durationUnitsNs = map[string]int64{}

func init() {
	for _, u := range []struct {
		names []string
		ns    int64
	}{
		{[]string{"nanos", "nsec", "ns"}, 1},
		{[]string{"usec", "us", "\u00b5s"}, 1_000},
		{[]string{"millis", "msec", "ms"}, 1_000_000},
		{[]string{"seconds", "second", "secs", "sec", "s"}, 1_000_000_000},
		{[]string{"minutes", "minute", "mins", "min", "m"}, 60 * 1_000_000_000},
		{[]string{"hours", "hour", "hrs", "hr", "h"}, 3_600 * 1_000_000_000},
		{[]string{"days", "day", "d"}, 86_400 * 1_000_000_000},
		{[]string{"weeks", "week", "w"}, 7 * 86_400 * 1_000_000_000},
		{[]string{"months", "month", "M"}, 2_630_016 * 1_000_000_000}, // 30.44 days, as humantime
		{[]string{"years", "year", "y"}, 31_557_600 * 1_000_000_000},  // 365.25 days
	} {
		for _, n := range u.names {
			durationUnitsNs[n] = u.ns
		}
	}
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// ParseDurationMs returns the milliseconds (rounded down, at most
// math.MaxInt64) of a duration in humantime's notation: one or more
// `<digits><unit>`, optionally separated by whitespace, as the Python SDK's
// duration parser reads it.
func ParseDurationMs(text string) (int64, error) {
	if text == "" {
		return 0, fmt.Errorf("empty duration")
	}
	total := new(big.Int)
	i, n := 0, len(text)
	for i < n {
		for i < n && isSpace(text[i]) {
			i++
		}
		j := i
		for j < n && text[j] >= '0' && text[j] <= '9' {
			j++
		}
		if j == i {
			return 0, fmt.Errorf("expected a number at %d", i)
		}
		number, _ := new(big.Int).SetString(text[i:j], 10)
		for j < n && isSpace(text[j]) {
			j++
		}
		k := j
		for k < n && (text[k] >= 'a' && text[k] <= 'z' || text[k] >= 'A' && text[k] <= 'Z' || strings.HasPrefix(text[k:], "\u00b5")) {
			if text[k] < 0x80 {
				k++
			} else {
				k += len("\u00b5")
			}
		}
		unit := text[j:k]
		if unit == "" && k < n {
			return 0, fmt.Errorf("invalid character at %d", k)
		}
		ns, ok := durationUnitsNs[unit]
		if !ok {
			return 0, fmt.Errorf("unknown time unit %q, supported units: ns, us, ms, s, m, h, d, w, M, y", unit)
		}
		total.Add(total, number.Mul(number, big.NewInt(ns)))
		if k < n && !isSpace(text[k]) && !(text[k] >= '0' && text[k] <= '9') {
			return 0, fmt.Errorf("invalid character at %d", k)
		}
		i = k
	}
	secs := new(big.Int).Quo(total, big.NewInt(1_000_000_000))
	if secs.Cmp(new(big.Int).Lsh(big.NewInt(1), 64)) >= 0 {
		return 0, fmt.Errorf("number is too large")
	}
	ms := total.Quo(total, big.NewInt(1_000_000))
	if !ms.IsInt64() {
		return math.MaxInt64, nil
	}
	return ms.Int64(), nil
}

// Level is a log level.
type Level uint8

// Log levels (the WIT enum `log.level`).
const (
	Trace Level = iota
	Debug
	Info
	Warn
	Error
)

// Logf writes a line to the host's log, tagged with the job and task (one
// boundary crossing: keep it off the per-record path). The host also turns
// stdout and stderr lines into log lines.
func Logf(level Level, format string, args ...any) {
	host().Log(uint8(level), fmt.Sprintf(format, args...))
}
