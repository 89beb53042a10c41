package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idrange/idrange/internal/clock"
	"github.com/idrange/idrange/internal/service"
	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/segment/etcdstore"
)

// openStore opens the etcd-backed segment.Store for cfg, feeding the
// store-only events (HWM races, corrupt values) to m.
func openStore(cli *clientv3.Client, cfg serveConfig, clk clock.Clock, log *slog.Logger, m *service.Metrics) (*segment.Store, error) {
	sc := cfg.storeConfig()
	sc.Now = clk.Now
	sc.Logger = log.With("component", "segment")
	sc.Observer = m.StoreObserver()
	stg, err := etcdstore.New(cli, etcdstore.Config{Prefix: cfg.KeyPrefix, Logger: sc.Logger})
	if err != nil {
		return nil, err
	}
	return segment.NewStore(stg, sc)
}

// storeConfig maps the store's flags onto segment.StoreConfig.
func (c serveConfig) storeConfig() segment.StoreConfig {
	return segment.StoreConfig{
		LeaseTTL: c.LeaseTTL,
		Policy:   segment.Policy{MaxBlock: int64(c.MaxBlock), MaxLead: c.MaxLead},
	}
}

// newServiceMinter is the minter behind the Next RPC (the per-ID
// baseline): a rangeclient over the replica's own store, opened on the
// first Next so a replica takes a worker code only if somebody asks.
func newServiceMinter(a segment.Allocator, region int, log *slog.Logger) *service.LazyMinter {
	return service.NewLazyMinter(func(ctx context.Context) (service.MinterCloser, error) {
		host, _ := os.Hostname()
		return rangeclient.New(ctx, rangeclient.Config{
			Allocator: a,
			Region:    region,
			Owner:     fmt.Sprintf("rangesvc Next %s/%d", host, os.Getpid()),
			Logger:    log.With("component", "next-minter"),
		})
	})
}
