//go:build !linux

package benchrun

import "syscall"

// hogSysProcAttr: without Pdeathsig the hog child stops when its stdin
// reaches EOF, which happens when the parent exits or dies.
func hogSysProcAttr() *syscall.SysProcAttr { return nil }
