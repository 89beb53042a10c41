//go:build unix

package main

import (
	"os/exec"
	"syscall"
)

// setGroup starts cmd in a process group of its own, so interrupt and kill
// reach the go command, the test binary and its fuzzing workers, as ^C in a
// terminal does.
func setGroup(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} }

// interrupt sends SIGINT to cmd's process group.
func interrupt(cmd *exec.Cmd) { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) }

// kill sends SIGKILL to cmd's process group.
func kill(cmd *exec.Cmd) { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
