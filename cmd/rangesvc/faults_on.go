//go:build idrange_faults

package main

import (
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/idrange/idrange/internal/testing/fakeclock"
)

// This file is compiled only with -tags idrange_faults, the build the fault
// suite and the end-to-end tests run (internal/testing/testenv.FaultBinary). A
// release build has neither these flags nor the SIGUSR1 handler.

// faultsBuild reports whether the test-only fault hooks are compiled in.
const faultsBuild = true

// faultConfig is serve's test-only fault flags.
type faultConfig struct {
	// ClockOffset (--fault-clock-offset) shifts the service clock.
	ClockOffset time.Duration
	// ClockFile (--fault-clock-file) is re-read on SIGUSR1; its content (a
	// Go duration) replaces the offset.
	ClockFile string
}

// register adds the fault flags to serve's flag set.
func (f *faultConfig) register(fs *flag.FlagSet) {
	fs.DurationVar(&f.ClockOffset, "fault-clock-offset", 0, "TEST ONLY: shift the service clock")
	fs.StringVar(&f.ClockFile, "fault-clock-file", "", "TEST ONLY: on SIGUSR1 read a clock offset from this file")
}

// serviceClock is the service clock shifted by --fault-clock-offset and, with
// --fault-clock-file, re-set on every SIGUSR1; stop ends the watcher.
func (f faultConfig) serviceClock(log *slog.Logger) (clk func() time.Time, stop func()) {
	log.Warn("TEST-ONLY fault injection enabled", "build_tag", "idrange_faults", "clock_offset", f.ClockOffset,
		"clock_file", f.ClockFile)
	off := &fakeclock.Offset{}
	off.Set(f.ClockOffset)
	if f.ClockFile == "" {
		return off.Now, func() {}
	}
	return off.Now, watchFaultClockFile(f.ClockFile, off, log)
}

// watchFaultClockFile re-reads path on every SIGUSR1 and sets the service
// clock offset to the Go duration it contains.
func watchFaultClockFile(path string, clk *fakeclock.Offset, log *slog.Logger) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-ch:
				b, err := os.ReadFile(path)
				if err != nil {
					log.Error("fault clock file", "path", path, "err", err)
					continue
				}
				d, err := time.ParseDuration(strings.TrimSpace(string(b)))
				if err != nil {
					log.Error("fault clock file: not a duration", "path", path, "err", err)
					continue
				}
				clk.Set(d)
				log.Warn("TEST-ONLY fault: service clock offset set", "offset", d)
			}
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}
