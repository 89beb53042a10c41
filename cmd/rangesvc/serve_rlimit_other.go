//go:build !linux

package main

// raiseOpenFileLimit does nothing outside Linux: the limit is unknown (0)
// and the connection caps are --max-connections as given.
func raiseOpenFileLimit() (before, after uint64, err error) { return 0, 0, nil }
