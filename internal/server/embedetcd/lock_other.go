//go:build !unix

package embedetcd

// lockDir is a no-op where flock is unavailable.
func lockDir(string) (func(), error) { return func() {}, nil }
