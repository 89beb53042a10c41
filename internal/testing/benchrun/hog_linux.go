package benchrun

import "syscall"

// hogSysProcAttr asks the kernel to kill the hog child when its parent dies
// (Pdeathsig), so a bench killed with SIGKILL leaves no busy process behind.
// Pdeathsig follows the thread that started the child; the Go runtime does
// not end its threads unless a goroutine locked to one exits, and the
// child's stdin EOF stops it in that case too.
func hogSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
