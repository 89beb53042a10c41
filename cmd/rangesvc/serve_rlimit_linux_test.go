package main

import (
	"fmt"
	"syscall"
	"testing"

	"github.com/idrange/idrange/internal/testing/testenv"
)

// serve raises a lowered soft open-file limit to the hard limit and
// reports both.
func TestRaiseOpenFileLimit(t *testing.T) {
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		testenv.Missing(t, "RLIMIT_NOFILE", fmt.Sprintf("getrlimit failed: %v", err))
	}
	if orig.Max < 512 {
		testenv.Missing(t, "a hard open-file limit of at least 512",
			fmt.Sprintf("this one is %d, too low to lower the soft limit below it; raise it (ulimit -Hn 4096, as root)", orig.Max))
	}
	t.Cleanup(func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
			t.Errorf("restore the open-file limit: %v", err)
		}
	})
	lowered := orig
	lowered.Cur = 256
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lowered); err != nil {
		t.Fatal(err)
	}
	before, after, err := raiseOpenFileLimit()
	if err != nil || before != 256 || after != orig.Max {
		t.Fatalf("raiseOpenFileLimit() = %d, %d, %v; want 256, %d", before, after, err, orig.Max)
	}
	var now syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &now); err != nil || now.Cur != orig.Max {
		t.Fatalf("soft limit after raising: %d (%v), want the hard limit %d", now.Cur, err, orig.Max)
	}
	if b, a, err := raiseOpenFileLimit(); err != nil || b != orig.Max || a != orig.Max {
		t.Fatalf("raising again: %d, %d, %v; want %d unchanged", b, a, err, orig.Max)
	}
}
