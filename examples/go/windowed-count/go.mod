module windowed-count

go 1.25

require sluice.dev/sdk/go v0.1.0
