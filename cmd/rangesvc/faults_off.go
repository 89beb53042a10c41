//go:build !idrange_faults

package main

import (
	"flag"
	"log/slog"
	"time"
)

// The release build: no fault flags, no signal handler, the system clock.
// faults_on.go (-tags idrange_faults) is the test build's counterpart.

// faultsBuild reports whether the test-only fault hooks are compiled in.
const faultsBuild = false

// faultConfig is empty: a release build has no fault flags.
type faultConfig struct{}

// register adds nothing.
func (*faultConfig) register(*flag.FlagSet) {}

// serviceClock is the system clock.
func (faultConfig) serviceClock(*slog.Logger) (func() time.Time, func()) { return time.Now, func() {} }
