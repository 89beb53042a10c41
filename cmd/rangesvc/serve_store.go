package main

import (
	"log/slog"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idrange/idrange/internal/clock"
	"github.com/idrange/idrange/internal/service"
	"github.com/idrange/idrange/segment"
)

// openStore opens the etcd-backed segment.Store for cfg, feeding the
// store-only events (HWM races, corrupt values) to m.
func openStore(cli *clientv3.Client, cfg serveConfig, clk clock.Clock, log *slog.Logger, m *service.Metrics) (*segment.Store, error) {
	sc := cfg.storeConfig()
	sc.Clock = clk
	sc.Logger = log.With("component", "segment")
	sc.Observer = m.StoreObserver()
	return segment.NewStore(cli, sc)
}

// storeConfig maps the store's flags onto segment.StoreConfig.
func (c serveConfig) storeConfig() segment.StoreConfig {
	return segment.StoreConfig{
		Prefix:   c.KeyPrefix,
		LeaseTTL: c.LeaseTTL,
		Policy:   segment.Policy{MaxBlock: int64(c.MaxBlock), MaxLead: c.MaxLead},
	}
}

// serviceMinter backs the Next RPC.
type serviceMinter interface {
	service.Minter
	Close() error
}

// newServiceMinter returns the minter behind Next, or nil (Next then
// answers Unimplemented) until rangeclient exists.
func newServiceMinter(a segment.Allocator, region int, log *slog.Logger) serviceMinter {
	return nil
}
