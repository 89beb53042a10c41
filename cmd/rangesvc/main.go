// Command rangesvc is idrange's one binary.
//
//	rangesvc serve   --region N --listen ADDR --metrics ADDR [--data-dir DIR | --etcd EPS]
//	rangesvc mint    --target ADDR -n N
//	rangesvc decode  ID...
//	rangesvc compare [flags]
//	rangesvc bench   [flags]
//
// Exit codes: 0 success, 1 runtime failure, 2 bad usage. Errors go to stderr;
// stdout carries only the command's output.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// Exit codes shared by every subcommand.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// usageError marks an error as bad usage (exit 2) rather than a runtime
// failure (exit 1).
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// command is one subcommand: run gets the arguments after its name.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands is the subcommand table; each lives in its own file.
var commands = map[string]command{
	"decode":  {"print the fields of IDs", runDecode},
	"serve":   {"run the regional range service (gRPC) on embedded or external etcd", runServe},
	"mint":    {"mint N IDs through a range service and print them", runMint},
	"compare": {"run one workload through each ID strategy and print a table", runCompare},
	"bench":   {"fleet load test: regions x workers at a target rate, every ID verified", runBench},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage(stderr)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "rangesvc: unknown command %q\n", args[0])
		printUsage(stderr)
		return exitUsage
	}
	err := cmd.run(ctx, args[1:], stdout, stderr)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errHelp):
		return exitOK
	case isUsage(err):
		fmt.Fprintf(stderr, "rangesvc %s: %v\n", args[0], err)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "rangesvc %s: %v\n", args[0], err)
		return exitFailure
	}
}

// errHelp is returned when the user asked for -h; the flag package already
// printed the usage.
var errHelp = errors.New("help requested")

func isUsage(err error) bool {
	var u usageError
	return errors.As(err, &u)
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: rangesvc <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
}
