//go:build soak

package region_test

import "time"

// Soak scale of the compaction acceptance test: issue 14's 16 MiB quota,
// filled within a minute, and the compactor at 1 s interval and retention.
const (
	spaceQuota      = 16 << 20
	spaceCompaction = time.Second
	spaceFillLimit  = time.Minute
)
