module sluice.dev/sdk/go

go 1.25

require go.bytecodealliance.org/pkg v0.4.0
