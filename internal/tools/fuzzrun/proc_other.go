//go:build !unix

package main

import (
	"os"
	"os/exec"
)

// setGroup does nothing where there are no process groups.
func setGroup(*exec.Cmd) {}

// interrupt interrupts the test binary, the fuzzing coordinator.
func interrupt(cmd *exec.Cmd) { _ = cmd.Process.Signal(os.Interrupt) }

// kill kills the test binary.
func kill(cmd *exec.Cmd) { _ = cmd.Process.Kill() }
