//go:build unix

package measure

import (
	"syscall"
	"time"
)

// CPUTime is the CPU time (user + system) this process has used so far.
// Differences of two readings over a wall-clock interval give the cores
// used; 0 where getrusage is not available (cputime_other.go).
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
