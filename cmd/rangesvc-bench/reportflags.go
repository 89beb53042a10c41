package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/idrange/idrange/internal/server/cli"
)

// reportFlags is the command line bench and compare share: a usage text
// above the flag defaults, --format (markdown or json), no positional
// arguments, and the report written on stdout in the chosen format.
type reportFlags struct {
	*flag.FlagSet
	format *string
}

// newReportFlags returns the FlagSet of `rangesvc name` with --format
// defined; the caller adds its own flags before parse.
func newReportFlags(name, usage string, stderr io.Writer) reportFlags {
	fs := cli.NewFlagSet(prog, name, stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, usage)
		fs.PrintDefaults()
	}
	return reportFlags{FlagSet: fs, format: fs.String("format", "markdown", "output format: markdown or json")}
}

// parse parses args and rejects positional arguments and an unknown
// --format, as usage errors.
func (f reportFlags) parse(args []string) error {
	if err := cli.ParseFlags(f.FlagSet, args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return cli.Usagef("unexpected arguments %q", f.Args())
	}
	if *f.format != "markdown" && *f.format != "json" {
		return cli.Usagef("--format %q: want markdown or json", *f.format)
	}
	return nil
}

// writableReport is a report that prints itself both ways
// (benchrun.Report, benchrun.SweepReport, comparerun.Report).
type writableReport interface {
	WriteMarkdown(io.Writer) error
	WriteJSON(io.Writer) error
}

// write prints rep to w in the --format chosen.
func (f reportFlags) write(w io.Writer, rep writableReport) error {
	if *f.format == "json" {
		return rep.WriteJSON(w)
	}
	return rep.WriteMarkdown(w)
}
