package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/snowflake"
)

// futureSlack is how far past this machine's clock a decoded timestamp may
// lie before decode calls the value impossible: more than any HWM lead or
// clock skew, far less than the years a foreign ID format would show.
const futureSlack = 24 * time.Hour

const decodeUsage = `usage: rangesvc decode [--allow-future] ID...

Prints one line per ID:
  id=.. time=RFC3339Nano region=.. worker=.. seq=..
An ID must be a positive decimal int64. One whose timestamp is more than 24h
ahead of this machine's clock could not have been minted yet and is refused
unless --allow-future is given.`

// runDecode prints one line per ID. Every argument is checked before any
// output, so a bad argument gives exit 2 and no partial table. Arguments are
// not parsed as flags (so "-5" is reported as a negative ID), except the
// two documented ones before the first ID.
func runDecode(_ context.Context, args []string, stdout, stderr io.Writer) error {
	allowFuture := false
	for len(args) > 0 {
		switch args[0] {
		case "-h", "--help", "-help":
			fmt.Fprintln(stderr, decodeUsage)
			return cli.ErrHelp
		case "--allow-future", "-allow-future":
			allowFuture = true
			args = args[1:]
			continue
		case "--":
			args = args[1:]
		}
		break
	}
	if len(args) == 0 {
		return cli.Usagef("no IDs given\n%s", decodeUsage)
	}
	limit := time.Now().Add(futureSlack)
	ids := make([]snowflake.ID, 0, len(args))
	for _, a := range args {
		id, err := snowflake.Parse(a)
		if err != nil {
			return cli.UsageError{Err: err}
		}
		if t := id.Time(); !allowFuture && t.After(limit) {
			return cli.UsageError{Err: errors.Wrapf(snowflake.ErrInvalidID,
				"%s has timestamp %s, after this machine's clock: it could not have been minted yet (a different ID format?); use --allow-future to decode anyway",
				a, t.Format(time.RFC3339))}
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		fmt.Fprintln(stdout, id.Parts().Format(id))
	}
	return nil
}
