package benchrun

import (
	"context"

	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/testing/measure"
)

// Env is a running set of regions, reusable across runs (the sweep).
type Env struct {
	etcds   []*localregion.Etcd
	regions []*localregion.Region
}

// StartEnv starts cfg.Regions in-process regions on one shared etcd (or
// one each with EtcdPerRegion).
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
			if e, err = localregion.StartEtcd(ctx, ""); err != nil {
				return nil, err
			}
			env.etcds = append(env.etcds, e)
			shared = e
		}
		reg, err := localregion.Start(ctx, localregion.Config{Region: r, Etcd: e.Server, Logger: cfg.Logger,
			SharedEtcd: !cfg.EtcdPerRegion})
		if err != nil {
			return nil, err
		}
		env.regions = append(env.regions, reg)
	}
	ok = true
	return env, nil
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
		for m, h := range r.RPCLatency() {
			if out[m] == nil {
				out[m] = measure.NewHistogram()
			}
			out[m].Merge(h)
		}
	}
	return out
}

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
