//go:build race

package main

// raceEnabled reports a -race build: the image test then skips (scripts/test
// runs it without -race; gzip and sha256 over the 26 MiB layer take ~45 s
// under the race detector, ~6 s without).
const raceEnabled = true
