//go:build !soak

package main

import "time"

// quietPeriods are the quiet periods of TestQuietReplicaServesTheDefaultClient
// in the default test run: longer than a block, the minter's idle timeout
// and a lease renewal.
var quietPeriods = []time.Duration{90 * time.Second}
