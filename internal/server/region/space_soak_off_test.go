//go:build !soak

package region_test

import "time"

// The compaction acceptance test's scale in the default run: a quota the
// flat-out load (about 97 backend bytes per grant) fills in seconds, and a
// compaction interval and retention short enough that the history kept
// (about 1 s of grants) stays far below it. -tags soak runs the 16 MiB
// variant (space_soak_on_test.go).
const (
	spaceQuota      = 8 << 20
	spaceCompaction = 500 * time.Millisecond
	// spaceFillLimit bounds the time the load may take to fill the quota
	// without compaction: a timeout, not a rate. The fill took 65 s on the
	// shared 2-core machine with two busy loops and a fault-suite run
	// beside it (90 s, the bound before, was too close); 2 min keeps the
	// whole test within scripts/test's 10 min (phase two runs 3x the fill).
	spaceFillLimit = 2 * time.Minute
)
