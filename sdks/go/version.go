package sluice

// Version is this SDK's version: module sluice.dev/sdk/go at v0.1.0, so a
// project's go.mod says `require sluice.dev/sdk/go v0.1.0` (build.sh
// resolves it to this directory through a go.work; nothing is downloaded).
// It implements world `packed-out` of package sluice:transform@0.1.5
// (wit/sluice.wit).
const Version = "0.1.0"
