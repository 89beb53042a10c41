//go:build soak

package faultsuite

// Soak mode (go test -tags soak): every hold is 8x longer and the minters run
// at twice the rate, so each scenario runs for minutes, not seconds.
const (
	soakHoldFactor = 8.0
	soakRateFactor = 2
	soakMode       = true
)
