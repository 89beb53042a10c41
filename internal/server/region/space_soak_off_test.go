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
	// without compaction (a loaded 2-core machine under -race is slow).
	spaceFillLimit = 90 * time.Second
)
