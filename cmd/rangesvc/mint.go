package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/snowflake"
)

// maxMint bounds -n so a typo cannot hold a code for hours.
const maxMint = 100_000_000

// mintConfig is `rangesvc mint`'s flags.
type mintConfig struct {
	Targets []string       // --target ADDR[,ADDR...] (required)
	N       int            // -n (required, 1..maxMint)
	Region  int            // --region (default -1: the service's region); 0..3: the service must serve it
	Timeout time.Duration  // --timeout (default 30s) for the whole run
	TLS     clientTLSFlags // --tls-cert, --tls-key, --tls-ca, --tls-server-name

	tls *tls.Config // loaded from TLS; nil: plaintext
}

func parseMintFlags(args []string, stderr io.Writer) (mintConfig, error) {
	var c mintConfig
	fs := cli.NewFlagSet(prog, "mint", stderr)
	targetFlag(fs, &c.Targets)
	fs.IntVar(&c.N, "n", 0, fmt.Sprintf("number of IDs to print (1..%d, required)", maxMint))
	fs.IntVar(&c.Region, "region", -1, "region (0..3) the service must serve; -1: whichever it serves, asked from it")
	fs.DurationVar(&c.Timeout, "timeout", 30*time.Second, "give up after this long")
	c.TLS.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: rangesvc mint --target ADDR[,ADDR...] -n N [--region R]\n\n"+
			"prints N decimal IDs of the service's region, one per line; --region R fails\n"+
			"unless the service serves region R")
		fs.PrintDefaults()
	}
	if err := cli.ParseFlags(fs, args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, cli.Usagef("unexpected arguments %q", fs.Args())
	}
	if err := checkTargets(c.Targets); err != nil {
		return c, err
	}
	switch {
	case c.N < 1 || c.N > maxMint:
		return c, cli.Usagef("-n %d not in 1..%d", c.N, maxMint)
	case c.Region < -1 || c.Region > snowflake.MaxRegion:
		return c, cli.Usagef("--region %d not in 0..%d", c.Region, snowflake.MaxRegion)
	case c.Timeout <= 0:
		return c, cli.Usagef("--timeout %v must be positive", c.Timeout)
	}
	var err error
	c.tls, err = c.TLS.config()
	return c, err
}

// runMint prints N IDs minted through the range service. All IDs are minted
// before any is printed, so a failure prints nothing on stdout.
func runMint(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseMintFlags(args, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	ids, err := mintIDs(ctx, c)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(stdout)
	for _, id := range ids {
		w.WriteString(id.String())
		w.WriteByte('\n')
	}
	return w.Flush()
}

// mintIDs mints N IDs with the buffered client (rangeclient) over the
// targets, then closes it (giving its lease back). The client learns the
// service's region; a --region 1..3 that differs fails in rangeclient.New,
// and --region 0 (which rangeclient reads as "learn it") is checked against
// the lease before any ID is minted.
func mintIDs(ctx context.Context, c mintConfig) ([]snowflake.ID, error) {
	cl, err := rangeclient.New(ctx, rangeclient.Config{
		Targets: c.Targets,
		TLS:     c.tls,
		Region:  max(c.Region, 0),
		Owner:   "rangesvc mint",
	})
	if err != nil {
		return nil, err
	}
	if got := cl.Lease().Lease.Region; c.Region >= 0 && got != c.Region {
		_ = cl.Close()
		return nil, errors.Newf("--region %d given, but the service at %v serves region %d", c.Region, c.Targets, got)
	}
	ids, err := cl.NextN(ctx, c.N)
	// Best effort: a lease that is not released expires by its TTL, and the
	// IDs already minted stay valid either way.
	_ = cl.Close()
	if err != nil {
		return nil, errors.Wrapf(err, "minted %d of %d", len(ids), c.N)
	}
	return ids, nil
}
