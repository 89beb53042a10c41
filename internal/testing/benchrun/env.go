package benchrun

import (
	"context"
	"log/slog"
	"runtime/pprof"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/client/engine"
	"github.com/idrange/idrange/internal/server/mintpool"
	"github.com/idrange/idrange/internal/server/region"
	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/testing/measure"
	"github.com/idrange/idrange/segment"
)

// Env is a running set of regions, reusable across runs (the sweep).
type Env struct {
	etcds   []*localregion.Etcd
	regions []*localregion.Region
}

// StartEnv starts cfg.Regions in-process regions on one shared etcd (or
// one each with EtcdPerRegion), with cfg.SharedRate as the bound of their
// shared path.
func StartEnv(ctx context.Context, cfg Config) (*Env, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	env := &Env{}
	ok := false
	defer func() {
		if !ok {
			env.Close()
		}
	}()
	var shared *localregion.Etcd
	for r := range cfg.Regions {
		e := shared
		if e == nil || cfg.EtcdPerRegion {
			var err error
			pprof.Do(ctx, roleLabel("etcd"), func(ctx context.Context) { e, err = localregion.StartEtcd(ctx, "") })
			if err != nil {
				return nil, err
			}
			env.etcds = append(env.etcds, e)
			shared = e
		}
		var reg *localregion.Region
		var err error
		pprof.Do(ctx, roleLabel("replica"), func(ctx context.Context) {
			reg, err = localregion.Start(ctx, localregion.Config{Region: r, Etcd: e.Server, Logger: cfg.Logger,
				SharedEtcd: !cfg.EtcdPerRegion, NextMinter: nextMinter(cfg.Logger), SharedRate: cfg.SharedRate})
		})
		if err != nil {
			return nil, err
		}
		env.regions = append(env.regions, reg)
	}
	ok = true
	return env, nil
}

// nextMinter opens a replica's Next minter as rangesvc serve does: a
// client engine over the replica's own store, holding one code.
func nextMinter(log *slog.Logger) region.NextFunc {
	return func(ctx context.Context, a segment.Allocator, region int) (mintpool.Minter, error) {
		return engine.New(ctx, engine.Config{Allocator: a, Region: region, Owner: "bench/next-minter", Logger: log})
	}
}

// enableShared turns on each region's Next minter, and with it the shared
// path, for a run of cfg in the many-clients mode; stop turns it off
// again (its code is given back), so a later run on the same environment
// is not charged for the minter's refills. Without the mode it does
// nothing.
func (e *Env) enableShared(ctx context.Context, cfg Config) (stop func(), err error) {
	var stops []func() error
	stop = func() {
		for _, s := range stops {
			s()
		}
	}
	if !cfg.SharedPath() {
		return stop, nil
	}
	for _, r := range e.regions {
		var s func() error
		var err error
		pprof.Do(ctx, roleLabel("replica"), func(ctx context.Context) { s, err = r.EnableNext(ctx) })
		if err != nil {
			stop()
			return nil, errors.Wrapf(err, "bench: shared path of region %d", r.RegionID())
		}
		stops = append(stops, s)
	}
	return stop, nil
}

// Close stops the regions and their etcds.
func (e *Env) Close() error {
	var first error
	for _, r := range e.regions {
		if err := r.Close(); err != nil && first == nil {
			first = err
		}
	}
	for _, x := range e.etcds {
		if err := x.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (e *Env) counts() localregion.Counts {
	var c localregion.Counts
	for _, r := range e.regions {
		c = c.Add(r.Counts())
	}
	return c
}

func (e *Env) rpcLatency() map[string]*measure.Histogram {
	out := map[string]*measure.Histogram{}
	for _, r := range e.regions {
		lat := r.RPCLatency()
		lat[storeGrantsMethod] = r.GrantLatency()
		for m, h := range lat {
			if out[m] == nil {
				out[m] = measure.NewHistogram()
			}
			out[m].Merge(h)
		}
	}
	return out
}

// storeGrantsMethod names the store's own grants in Report.ServerLatency.
const storeGrantsMethod = "store grant (etcd write)"

// rpcLatencySince summarises the RPCs served after the snapshot before:
// histograms only grow, so the run's own part is the bucket difference.
func (e *Env) rpcLatencySince(before map[string]*measure.Histogram) map[string]measure.Summary {
	out := map[string]measure.Summary{}
	for m, h := range e.rpcLatency() {
		if b := before[m]; b != nil {
			h.Subtract(b)
		}
		if h.Count() > 0 {
			out[m] = h.Summary()
		}
	}
	return out
}
