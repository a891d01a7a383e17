//go:build !wasip1

package sluice

import (
	"sluice.dev/sdk/go/internal/hostapi"
	"sluice.dev/sdk/go/internal/simhost"
)

// Natively (go test) there is no component host: the SDK runs against the
// in-memory one of internal/simhost, which package sluicetest drives.
func init() {
	hostapi.Current = simhost.New()
}
