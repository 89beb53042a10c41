package faultsuite

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// Controls for what no history can show: a minter that dies, and a
// minter whose history stops taking writes. Each must fail the run; the
// controls on the histories themselves (a planted duplicate, a late ID, a
// late return, a batch reply repeating a minter's ID) are in
// checkPlantedFaults and checkPlantedReplies.

// TestPlantedMinterFailuresFailTheRun: m1 crashes (SIGQUIT: Go prints its
// goroutines and exits 2), and m2's history stops taking writes (its file
// size limit is lowered to the file's size, as a full disk would do): m2
// must stop minting and exit 1 by itself, saying why. The run must then
// fail with errMinterExit for each of the two, carrying its exit status and
// stderr, and for nothing about m0.
func TestPlantedMinterFailuresFailTheRun(t *testing.T) {
	s := newSuite(t, options{})
	s.waitMinting(s.mono0, 1000, time.Minute)
	m0, m1, m2 := s.minters[0], s.minters[1], s.minters[2]

	s.fault("SIGQUIT %s: it crashes", m1.name)
	m1.p.signal(syscall.SIGQUIT)
	fi, err := os.Stat(m2.path)
	if err != nil {
		t.Fatal(err)
	}
	s.fault("limit %s's file size to its history's %d bytes: the next write fails", m2.name, fi.Size())
	m2.p.limitFileSize(uint64(fi.Size()))
	waitFor(t, time.Minute, m1.name+" exits", m1.p.exited)
	waitFor(t, time.Minute, m2.name+" stops by itself", m2.p.exited)

	_, err = s.collect()
	if !errors.Is(err, errMinterExit) {
		t.Fatalf("the run did not fail on the planted minter failures: %v", err)
	}
	msg := err.Error()
	for _, want := range []string{
		m1.name + " exited before the end of the scenario (exit status 2)", "goroutine ", // its dump on stderr
		m2.name + " exited before the end of the scenario (exit status 1)", "file too large",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the run's error does not say %q:\n%v", want, err)
		}
	}
	if strings.Contains(msg, m0.name+" exited") {
		t.Errorf("the healthy %s was reported:\n%v", m0.name, err)
	}
	var said []string // the lines naming each failure, not the whole dump
	for _, l := range strings.Split(msg, "\n") {
		if strings.Contains(l, "exited") || strings.Contains(l, "minter:") {
			said = append(said, strings.TrimSpace(l))
		}
	}
	t.Logf("planted crash and recorder error caught:\n%s", strings.Join(said, "\n"))
}

// limitFileSize lowers the process's RLIMIT_FSIZE to n bytes (prlimit(2)):
// its next write to a regular file past n fails with EFBIG (Go ignores
// SIGXFSZ), as on a full disk.
func (p *proc) limitFileSize(n uint64) {
	p.t.Helper()
	lim := syscall.Rlimit{Cur: n, Max: n}
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(p.pid()), uintptr(syscall.RLIMIT_FSIZE),
		uintptr(unsafe.Pointer(&lim)), 0, 0, 0); e != 0 {
		p.t.Fatalf("%s: prlimit(RLIMIT_FSIZE, %d): %v", p.name, n, e)
	}
}
