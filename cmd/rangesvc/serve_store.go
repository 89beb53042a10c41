package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/idrange/idrange/internal/client/engine"
	"github.com/idrange/idrange/internal/server/mintpool"
	"github.com/idrange/idrange/internal/server/region"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/segment"
)

// storeConfig maps the store's flags onto store.Config.
//
// The restart floor is on with an external etcd (--etcd) only. The embedded
// etcd runs inside this process: while the replica is down its etcd is down
// too, so nobody can lower a mark through etcd behind the replica's back
// (only by editing its data files, which no floor can stop), and the floor
// would cost every start a jump of the codes' timestamps to the lead for
// nothing (docs/design.md, "A floor that survives restarts").
func (c serveConfig) storeConfig() store.Config {
	return store.Config{
		LeaseTTL:     c.LeaseTTL,
		Policy:       segment.Policy{MaxBlock: int64(c.MaxBlock), MaxLead: c.MaxLead},
		RestartFloor: len(c.Etcd) > 0,
		MaxClockSkew: c.MaxClockSkew,
	}
}

// nextMinter opens one code's minter of the replica's own (MintBatch, Next,
// the shared path): a client engine over the replica's own store, holding
// a lease as owner.
func nextMinter(owner string, log *slog.Logger) region.NextFunc {
	return func(ctx context.Context, a segment.Allocator, region int) (mintpool.Minter, error) {
		return engine.New(ctx, engine.Config{
			Allocator: a,
			Region:    region,
			Owner:     owner,
			// One code of its own, always: this minter is what the shared
			// path carves from, so it can never be a shared client itself.
			Codes:  1,
			Logger: log,
		})
	}
}

// serveNextOwner names serve's Next minter lease after the host and process.
func serveNextOwner() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("rangesvc Next %s/%d", host, os.Getpid())
}
