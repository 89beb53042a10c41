package main

import (
	"syscall"

	"github.com/cockroachdb/errors"
)

// raiseOpenFileLimit raises the soft open-file limit (RLIMIT_NOFILE) to
// the hard limit and returns it before and after. The Go runtime already
// raises it at start, to one below the hard limit (package syscall's
// init), so before usually reads hard-1 and the limit the process was
// started with is not visible here; serve raises it itself to know and
// log the limit its connection caps are sized against.
func raiseOpenFileLimit() (before, after uint64, err error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, 0, errors.Wrap(err, "read the open-file limit (RLIMIT_NOFILE)")
	}
	before = rl.Cur
	if rl.Cur >= rl.Max {
		return before, before, nil
	}
	rl.Cur = rl.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return before, before, errors.Wrapf(err, "raise the open-file limit from %d to the hard limit %d", before, rl.Max)
	}
	return before, rl.Cur, nil
}
