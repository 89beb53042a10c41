// Package measure is what idrange's measuring code (bench, compare, the
// in-process region, the fault suite's history checker) measures and
// verifies with, in one place:
//
//   - Histogram and Summary: a log-linear latency histogram (hdr.go);
//   - Checker: the after-the-fact check that a large set of IDs is unique
//     and in range (idcheck.go);
//   - Machine: the host a figure was measured on (machine.go);
//   - RPCCounter: gRPC calls and wire bytes of one connection (rpccount.go);
//   - Dur, Latency, SI, WriteJSON: how figures are printed (format.go).
//
// A check in use:
//
//	c, _ := measure.NewChecker(measure.CheckConfig{NotBefore: start, NotAfter: end})
//	c.Add(ids...)            // from any goroutine, in batches
//	res := c.Check()
//	if err := res.Err(); err != nil { ... }  // errors.Is(err, measure.ErrDuplicate)
//
// It measures and reports, never repairs. rangesvc-bench links it, so it
// does not import testing: its test helpers take no testing.TB.
package measure
