//go:build !linux

package history

import "time"

// Now is the wall clock in nanoseconds on systems other than Linux. The
// fault suite runs on Linux, where Now is CLOCK_MONOTONIC (shared by all
// processes and never stepped); here it is only good enough to compile and
// run the unit tests.
func Now() int64 { return time.Now().UnixNano() }
