package main

import (
	"context"
	"fmt"
	"io"

	"github.com/idrange/idrange/snowflake"
)

// runDecode prints one line per ID. Every argument is checked before any
// output, so a bad argument gives exit 2 and no partial table.
func runDecode(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("decode", stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: rangesvc decode ID...\n\nprints: id=.. time=RFC3339Nano region=.. worker=.. seq=..")
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return usagef("no IDs given (usage: rangesvc decode ID...)")
	}
	ids := make([]snowflake.ID, 0, fs.NArg())
	for _, a := range fs.Args() {
		id, err := snowflake.Parse(a)
		if err != nil {
			return usageError{err}
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		fmt.Fprintln(stdout, id.Parts().Format(id))
	}
	return nil
}
