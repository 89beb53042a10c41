//go:build unix

package main

import (
	"os/exec"
	"syscall"
)

// setGroup starts cmd in a process group of its own, so kill reaches the
// test binary and its fuzzing workers.
func setGroup(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} }

// interrupt sends SIGINT to cmd's process alone, the fuzzing coordinator:
// it stops its workers itself. (The group's ^C can make a worker exit in
// the middle of an input, which the coordinator then records as a crash.)
func interrupt(cmd *exec.Cmd) { _ = cmd.Process.Signal(syscall.SIGINT) }

// kill sends SIGKILL to cmd's process group.
func kill(cmd *exec.Cmd) { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
