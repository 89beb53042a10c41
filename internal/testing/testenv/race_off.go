//go:build !race

package testenv

// Race reports whether the test binary runs under the race detector.
const Race = false
