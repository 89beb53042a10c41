//go:build !soak

package faultsuite

// Short mode (the default, run by go test ./...): every scenario holds each
// fault for a few seconds.
const (
	soakHoldFactor = 1.0
	soakRateFactor = 1
	soakMode       = false
)
