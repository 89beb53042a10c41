//go:build soak

package main

import "time"

// quietPeriods with -tags soak: issue 32's 75 s and 10 minutes too.
var quietPeriods = []time.Duration{75 * time.Second, 90 * time.Second, 10 * time.Minute}
