package etcdspace

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Defaults of CompactorConfig (and of `rangesvc serve`'s flags).
const (
	// DefaultCompactionInterval is how often the leading replica compacts
	// (kube-apiserver's --etcd-compaction-interval default).
	DefaultCompactionInterval = 5 * time.Minute
	// DefaultCompactionRetention is how much history a compaction keeps:
	// it compacts to the revision observed this long ago.
	DefaultCompactionRetention = 5 * time.Minute
	// DefaultSessionTTL is the TTL in seconds of the lease that holds the
	// compactor key: a crashed leader's successor takes over within it.
	DefaultSessionTTL = 10
	// MinSampleEvery bounds how often revisions are sampled.
	MinSampleEvery = 50 * time.Millisecond
)

// CompactorConfig configures a Compactor. Etcd and Key are required.
type CompactorConfig struct {
	// Etcd is the client (required); the caller closes it after Run returns.
	Etcd *clientv3.Client
	// Key is the election prefix every replica of the etcd cluster shares
	// (required), e.g. "/idrange/v1/compactor".
	Key string
	// Name identifies this replica in the election value and the logs.
	// Default "<hostname>/<pid>/<n>".
	Name string
	// Interval is how often the leader compacts. Default
	// DefaultCompactionInterval; it must be positive (a replica that
	// should not compact does not run a Compactor).
	Interval time.Duration
	// Retention is how much history a compaction keeps: the leader
	// compacts to the newest revision it sampled at least Retention ago.
	// Default DefaultCompactionRetention.
	Retention time.Duration
	// SessionTTL is the TTL in seconds of the lease holding the compactor
	// key. Default DefaultSessionTTL.
	SessionTTL int
	// Registerer receives the compactor metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Logger receives the compactor's logs. Default: discard.
	Logger *slog.Logger

	// now is the clock of the revision samples; time.Now unless a test
	// replaces it.
	now func() time.Time
}

var replicaSeq atomic.Int64

func (c CompactorConfig) withDefaults() CompactorConfig {
	if c.Name == "" {
		host, _ := os.Hostname()
		c.Name = fmt.Sprintf("%s/%d/%d", host, os.Getpid(), replicaSeq.Add(1))
	}
	if c.Interval == 0 {
		c.Interval = DefaultCompactionInterval
	}
	if c.Retention == 0 {
		c.Retention = DefaultCompactionRetention
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = DefaultSessionTTL
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c
}

// Validate reports the first bad field.
func (c CompactorConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Etcd == nil:
		return errors.New("etcdspace: CompactorConfig.Etcd is required")
	case c.Key == "":
		return errors.New("etcdspace: CompactorConfig.Key is required")
	case c.Interval < 0:
		return errors.Newf("etcdspace: CompactorConfig.Interval %v is negative", c.Interval)
	case c.Retention < 0:
		return errors.Newf("etcdspace: CompactorConfig.Retention %v is negative", c.Retention)
	case c.SessionTTL < 1:
		return errors.Newf("etcdspace: CompactorConfig.SessionTTL %d is below 1 s", c.SessionTTL)
	}
	return nil
}

// sample is the cluster revision observed at a time.
type sample struct {
	at  time.Time
	rev int64
}

// Compactor compacts etcd's history to the revision observed Retention ago,
// every Interval, on the one replica that holds the compactor key (an etcd
// election under Key, held by a lease). Every replica samples the revision,
// so a successor can compact as soon as it leads.
type Compactor struct {
	cfg CompactorConfig
	log *slog.Logger

	leader      prometheus.Gauge
	compactions prometheus.Counter
	errs        prometheus.Counter
	compacted   prometheus.Gauge

	leading atomic.Bool

	mu      sync.Mutex
	samples []sample // oldest first
	last    int64    // highest revision this replica compacted to
}

// NewCompactor validates cfg and registers the metrics. Nothing runs until
// Run.
func NewCompactor(cfg CompactorConfig) (*Compactor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	c := &Compactor{
		cfg: cfg,
		log: cfg.Logger.With("component", "compactor", "replica", cfg.Name),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "idrange", Subsystem: "compactor", Name: "leader",
			Help: "1 while this replica holds the compactor key and compacts etcd history, else 0."}),
		compactions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "idrange", Subsystem: "compactor", Name: "compactions_total",
			Help: "etcd history compactions this replica made (including ones etcd had already done)."}),
		errs: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "idrange", Subsystem: "compactor", Name: "errors_total",
			Help: "etcd history compactions that failed."}),
		compacted: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "idrange", Subsystem: "compactor", Name: "compacted_revision",
			Help: "The etcd revision this replica last compacted history to."}),
	}
	if cfg.Registerer != nil {
		for _, m := range []prometheus.Collector{c.leader, c.compactions, c.errs, c.compacted} {
			if err := cfg.Registerer.Register(m); err != nil {
				return nil, errors.Wrap(err, "etcdspace: register compactor metrics")
			}
		}
	}
	return c, nil
}

// Leading reports whether this replica holds the compactor key now.
func (c *Compactor) Leading() bool { return c.leading.Load() }

// sampleEvery is the revision sampling period: half the shorter of
// Interval and Retention, so a compaction keeps between Retention and
// Retention plus half of it.
func (c *Compactor) sampleEvery() time.Duration {
	return max(min(c.cfg.Interval, c.cfg.Retention)/2, MinSampleEvery)
}

// Run samples the revision and campaigns for the compactor key until ctx
// ends; while it leads, it compacts every Interval. On the way out it gives
// the key up, so another replica takes over at once.
func (c *Compactor) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { c.sampleLoop(ctx) })
	defer wg.Wait()
	backoff := time.Second
	for ctx.Err() == nil {
		if err := c.lead(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("compactor: election failed; retrying", "err", err, "retry_in", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		backoff = time.Second
	}
}

// lead is one term: a session, a campaign, compactions while the session
// lives, then resignation.
func (c *Compactor) lead(ctx context.Context) error {
	sess, err := concurrency.NewSession(c.cfg.Etcd, concurrency.WithTTL(c.cfg.SessionTTL), concurrency.WithContext(ctx))
	if err != nil {
		return errors.Wrap(err, "session")
	}
	defer sess.Close() // revokes the lease: the key goes with it
	// A campaign must end when the session's lease is lost, or this
	// replica would later believe it leads with a key that is gone.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-sess.Done():
			cancel()
		case <-cctx.Done():
		}
	}()
	el := concurrency.NewElection(sess, c.cfg.Key)
	if err := el.Campaign(cctx, c.cfg.Name); err != nil {
		select {
		case <-ctx.Done():
			return nil
		case <-sess.Done():
			c.log.Info("compactor: session lease lost while waiting for the key; campaigning again")
			return nil
		default:
		}
		return errors.Wrap(err, "campaign")
	}
	c.leading.Store(true)
	c.leader.Set(1)
	c.log.Info("compactor: leading", "key", c.cfg.Key, "interval", c.cfg.Interval, "retention", c.cfg.Retention)
	defer func() {
		// Stop counting as leader before the key is given up, so two
		// replicas never both report leading after an orderly hand-over.
		c.leading.Store(false)
		c.leader.Set(0)
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer rcancel()
		if err := el.Resign(rctx); err != nil && ctx.Err() == nil {
			c.log.Warn("compactor: resign failed; the key goes with the session's lease", "err", err)
		}
	}()
	tick := time.NewTicker(c.cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			c.log.Info("compactor: stopping; giving the key up")
			return nil
		case <-sess.Done():
			c.log.Warn("compactor: lost the compactor key (session lease expired); campaigning again")
			return nil
		case <-tick.C:
			c.compact(ctx)
		}
	}
}

// sampleLoop records the cluster revision every sampleEvery.
func (c *Compactor) sampleLoop(ctx context.Context) {
	t := time.NewTicker(c.sampleEvery())
	defer t.Stop()
	for {
		c.sampleNow(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sampleNow reads the current revision (the header of a count-only read)
// and records it.
func (c *Compactor) sampleNow(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, max(c.sampleEvery(), time.Second))
	resp, err := c.cfg.Etcd.Get(sctx, c.cfg.Key, clientv3.WithCountOnly())
	cancel()
	if err != nil {
		return // etcd unreachable: no sample; the health check reports it
	}
	c.record(c.cfg.now(), resp.Header.Revision)
}

// record appends a sample and forgets those no compaction will use: all
// but the newest sample that is at least Retention old.
func (c *Compactor) record(at time.Time, rev int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.samples = append(c.samples, sample{at, rev})
	cut := 0
	for i, s := range c.samples {
		if at.Sub(s.at) >= c.cfg.Retention {
			cut = i
		}
	}
	c.samples = c.samples[cut:]
}

// target is the newest revision sampled at least Retention before now, 0
// if there is none yet (the replica started less than Retention ago).
func (c *Compactor) target(now time.Time) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var rev int64
	for _, s := range c.samples {
		if now.Sub(s.at) >= c.cfg.Retention {
			rev = s.rev
		}
	}
	return rev
}

// compact compacts to the target revision, if it moved.
func (c *Compactor) compact(ctx context.Context) {
	rev := c.target(c.cfg.now())
	c.mu.Lock()
	last := c.last
	c.mu.Unlock()
	if rev <= last {
		return
	}
	// Compaction cannot affect uniqueness. It removes only revisions that a
	// later revision of the same key superseded (and keys deleted before
	// rev); the current value of every key, its ModRevision and its
	// CreateRevision stay as they are. Every grant, acquisition, renewal
	// and release compares and reads current values only (the HWM and its
	// ModRevision, the lease key's CreateRevision = the fencing token),
	// never an old revision, so the rules of docs/design.md
	// ("Correctness") see exactly what they saw before. What compaction
	// does take away is reading or watching history older than rev: only
	// tools replaying history need it (the fault suite runs serve with
	// --compaction-interval 0).
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err := c.cfg.Etcd.Compact(cctx, rev)
	cancel()
	switch {
	case err == nil:
	case errors.Is(err, rpctypes.ErrCompacted):
		// Already compacted at or beyond rev (by a previous leader or by
		// etcd's own auto-compaction): the history is gone, as wanted.
		err = nil
	case ctx.Err() != nil:
		return
	default:
		c.errs.Inc()
		c.log.Warn("compactor: compaction failed", "revision", rev, "err", err)
		return
	}
	c.mu.Lock()
	c.last = rev
	c.mu.Unlock()
	c.compactions.Inc()
	c.compacted.Set(float64(rev))
	c.log.Info(fmt.Sprintf("compactor: compacted to revision %d", rev), "revision", rev)
}
