//go:build !unix

package main

import (
	"os"
	"os/exec"
)

// setGroup does nothing where there are no process groups.
func setGroup(*exec.Cmd) {}

// interrupt interrupts the go command (where signals exist).
func interrupt(cmd *exec.Cmd) { _ = cmd.Process.Signal(os.Interrupt) }

// kill kills the go command.
func kill(cmd *exec.Cmd) { _ = cmd.Process.Kill() }
