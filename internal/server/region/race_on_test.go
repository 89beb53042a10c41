//go:build race

package region_test

// raceEnabled: the race detector is on (it slows the in-process etcd about
// tenfold: a flat-out grant load runs at a few hundred grants/s).
const raceEnabled = true
