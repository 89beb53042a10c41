// Command rangesvc-bench holds idrange's measurement commands, apart from
// the server binary (they link the plotting, UUID and in-process region
// code the server does not need):
//
//	rangesvc-bench compare [flags]
//	rangesvc-bench bench   [flags]
//
// `rangesvc compare` and `rangesvc bench` run this binary when it is
// installed next to rangesvc or on $PATH.
//
// A hidden third subcommand, `rangesvc-bench cpu-hog --cores N`, is the
// child process `bench --cpu-hog N` starts to keep N cores busy
// (benchrun.HogMain); it is not meant to be run by hand.
//
// Exit codes: 0 success, 1 runtime failure, 2 bad usage. Errors go to
// stderr; stdout carries only the command's output.
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/testing/benchrun"
)

// prog is the name the measurement commands report under: they are the
// documented `rangesvc compare` and `rangesvc bench`.
const prog = "rangesvc"

var commands = map[string]cli.Command{
	"compare": {Summary: "run one workload through each ID strategy and print a table", Run: runCompare},
	"bench":   {Summary: "fleet load test: regions x workers at a target rate, every ID verified", Run: runBench},
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == benchrun.HogSubcommand {
		if err := benchrun.HogMain(os.Args[2:], os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(cli.ExitFailure)
		}
		return
	}
	cli.Main(prog, commands)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Run(ctx, prog, commands, args, stdout, stderr)
}
