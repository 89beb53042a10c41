package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/idrange/idrange/internal/server/buildinfo"
	"github.com/idrange/idrange/internal/server/cli"
)

// runVersion prints the binary's build: module version, VCS revision (and
// whether the tree was modified), commit time and Go version; `-o json`
// prints the same as one JSON object for scripts.
func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet(prog, "version", stderr)
	format := fs.String("o", "text", "output format: text or json")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: rangesvc version [-o text|json]")
		fs.PrintDefaults()
	}
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected arguments %q", fs.Args())
	}
	in := buildinfo.Read()
	switch *format {
	case "text":
		rev := in.Revision
		if in.Modified {
			rev += " (modified)"
		}
		_, err := fmt.Fprintf(stdout, "version:  %s\nrevision: %s\nvcs time: %s\ngo:       %s\n",
			in.Version, rev, in.Time, in.GoVersion)
		return err
	case "json":
		return json.NewEncoder(stdout).Encode(in)
	}
	return cli.Usagef("-o %q: want text or json", *format)
}
