//go:build linux

package history

import (
	"syscall"
	"time"
	"unsafe"
)

// Now is the host's CLOCK_MONOTONIC in nanoseconds: one time base shared by
// every process on the machine (unlike Go's monotonic readings, which are
// relative to each process), never stepped, and independent of the clocks
// the suite fakes (the service's --fault-clock-file offset). Every time in a history is on this base, so the test
// process can compare a fault it injected with what each minter did.
//
// It reads the kernel clock once and then follows Go's monotonic clock,
// which is CLOCK_MONOTONIC on Linux, so a reading costs what time.Now does.
func Now() int64 { return monoBase + int64(time.Since(goBase)) }

var monoBase, goBase = calibrate()

func calibrate() (int64, time.Time) {
	var ts syscall.Timespec
	g := time.Now()
	const clockMonotonic = 1 // CLOCK_MONOTONIC on Linux
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockMonotonic, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		panic("history: clock_gettime(CLOCK_MONOTONIC): " + e.Error())
	}
	return ts.Nano(), g
}
