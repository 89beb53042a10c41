//go:build !unix

package measure

import "time"

// CPUTime is 0: there is no getrusage here (cputime_unix.go).
func CPUTime() time.Duration { return 0 }
