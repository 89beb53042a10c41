package comparerun

import (
	"context"
	"fmt"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/client/engine"
	"github.com/idrange/idrange/internal/server/mintpool"
	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/segment"
)

// RunWithRegion is Run for callers that have no range service of their
// own (rangesvc compare, the public compare package): when a strategy
// needs one and cfg.Region is nil, it starts an in-process region 0
// (embedded etcd with fsync, rangesvc on 127.0.0.1) after validating cfg,
// and closes it after the run. Strategies that need no service start
// nothing.
func RunWithRegion(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Region != nil || cfg.needsRegion() == "" {
		return Run(ctx, cfg)
	}
	cfg = cfg.withDefaults()
	fmt.Fprintln(cfg.Progress, "compare: starting an in-process region 0 (embedded etcd with fsync, rangesvc on 127.0.0.1)")
	start := time.Now()
	r, err := localregion.Start(ctx, localregion.Config{Region: 0, NextMinter: nextMinter})
	if err != nil {
		return nil, errors.Wrap(err, "start the in-process region")
	}
	defer r.Close()
	fmt.Fprintf(cfg.Progress, "compare: region ready at %s in %v\n", r.Addr(), time.Since(start).Round(time.Millisecond))
	cfg.Region = r
	return Run(ctx, cfg)
}

// nextMinter serves the region's Next and MintBatch RPCs as rangesvc
// serve does: a client engine over the region's own store.
func nextMinter(ctx context.Context, a segment.Allocator, region int) (mintpool.Minter, error) {
	return engine.New(ctx, engine.Config{Allocator: a, Region: region, Owner: "rangesvc/next-rpc"})
}
