// Package cli is the command-line frame shared by idrange's binaries
// (rangesvc, rangesvc-bench): a table of subcommands, flag sets that report
// errors instead of exiting, and one mapping of errors to exit codes.
//
// Exit codes: 0 success, 1 runtime failure, 2 bad usage. Errors go to
// stderr; stdout carries only the command's output.
package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/cockroachdb/errors"
)

// Exit codes shared by every subcommand.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
)

// UsageError marks an error as bad usage (exit 2) rather than a runtime
// failure (exit 1).
type UsageError struct{ Err error }

func (u UsageError) Error() string { return u.Err.Error() }
func (u UsageError) Unwrap() error { return u.Err }

// Usagef is a UsageError with a formatted message.
func Usagef(format string, args ...any) error {
	return UsageError{errors.Newf(format, args...)}
}

// IsUsage reports whether err is (or wraps) a UsageError.
func IsUsage(err error) bool {
	var u UsageError
	return errors.As(err, &u)
}

// ErrHelp is returned when the user asked for -h; the usage was already
// printed. It exits 0.
var ErrHelp = errors.New("help requested")

// Command is one subcommand: Run gets the arguments after its name.
type Command struct {
	Summary string
	Run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// Main runs the command named by os.Args[1] with a context cancelled on
// SIGINT or SIGTERM, and exits with Run's status. It is a binary's main.
func Main(prog string, cmds map[string]Command) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Run(ctx, prog, cmds, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Run runs the subcommand args[0] of program prog from cmds and returns the
// exit code.
func Run(ctx context.Context, prog string, cmds map[string]Command, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		PrintUsage(stderr, prog, cmds)
		if len(args) == 0 {
			return ExitUsage
		}
		return ExitOK
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "%s: unknown command %q\n", prog, args[0])
		PrintUsage(stderr, prog, cmds)
		return ExitUsage
	}
	err := cmd.Run(ctx, args[1:], stdout, stderr)
	var exit ExitError
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrHelp):
		return ExitOK
	case errors.As(err, &exit):
		return exit.Code
	case IsUsage(err):
		fmt.Fprintf(stderr, "%s %s: %v\n", prog, args[0], err)
		return ExitUsage
	default:
		fmt.Fprintf(stderr, "%s %s: %v\n", prog, args[0], err)
		return ExitFailure
	}
}

// ExitError makes Run exit with Code and print nothing: the command has
// reported the failure itself (a forwarded command's own exit status).
type ExitError struct{ Code int }

func (e ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// PrintUsage lists the subcommands of prog.
func PrintUsage(w io.Writer, prog string, cmds map[string]Command) {
	fmt.Fprintf(w, "usage: %s <command> [flags]\n\ncommands:\n", prog)
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, cmds[n].Summary)
	}
}

// NewFlagSet returns a FlagSet named "prog name" that reports errors
// instead of exiting, so every subcommand maps bad flags to exit status 2
// the same way.
func NewFlagSet(prog, name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(prog+" "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// ParseFlags parses args and turns flag errors into usage errors.
func ParseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ErrHelp
		}
		return UsageError{err}
	}
	return nil
}

// SplitList splits a comma-separated flag value, dropping empty items.
func SplitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
