//go:build race

package engine

// raceEnabled: the race detector is on (it slows in-process etcd several times).
const raceEnabled = true
