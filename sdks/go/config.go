package sluice

// Configuration and logging.

import (
	"fmt"

	witTypes "go.bytecodealliance.org/pkg/wit/types"

	"sluice/internal/wit/imports/sluice_transform_log"
)

// Config is the job's transform configuration: string pairs in the job's
// order. When a key repeats, the last value wins.
type Config struct {
	entries []witTypes.Tuple2[string, string]
}

func newConfig(entries []witTypes.Tuple2[string, string]) *Config {
	return &Config{entries: entries}
}

// Get returns the value of setting name.
func (c *Config) Get(name string) (string, bool) {
	value, found := "", false
	for _, e := range c.entries {
		if e.F0 == name {
			value, found = e.F1, true
		}
	}
	return value, found
}

// Require returns the value of setting name, or an error if it is missing.
func (c *Config) Require(name string) (string, error) {
	if v, ok := c.Get(name); ok {
		return v, nil
	}
	return "", fmt.Errorf("missing config setting %q", name)
}

// Len returns the number of settings (repeats included).
func (c *Config) Len() int { return len(c.entries) }

// Level is a log level.
type Level = sluice_transform_log.Level

// Log levels.
const (
	Trace Level = sluice_transform_log.Level_Trace
	Debug Level = sluice_transform_log.Level_Debug
	Info  Level = sluice_transform_log.Level_Info
	Warn  Level = sluice_transform_log.Level_Warn
	Error Level = sluice_transform_log.Level_Error
)

// Logf writes a line to the host's log, tagged with the job and task. (The
// host also turns stdout and stderr lines into log lines.)
func Logf(level Level, format string, args ...any) {
	sluice_transform_log.Log(level, fmt.Sprintf(format, args...))
}
