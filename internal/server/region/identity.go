package region

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idrange/idrange/internal/server/regionid"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/segment"
)

// DefaultRegistryCheckInterval is how often a replica confirms its region's
// registry claim.
const DefaultRegistryCheckInterval = 30 * time.Second

// ErrRegionRefused wraps every reason a replica refuses to grant because of
// its region's identity: a record of another region, a corrupt or missing
// record, a pending restore, a revision that went back, a registry claim of
// another region.
var ErrRegionRefused = errors.New("region refused")

// Refusal reasons, the label values of idrange_region_refused.
const (
	reasonRecordMissing     = "record_missing"
	reasonRecordCorrupt     = "record_corrupt"
	reasonRegionMismatch    = "region_mismatch"
	reasonRestorePending    = "restore_pending"
	reasonRevisionRollback  = "revision_rollback"
	reasonRegistryConflict  = "registry_conflict"
	reasonRegistryCorrupt   = "registry_corrupt"
	reasonRegistryUnconfirm = "registry_unconfirmed"
)

var allReasons = []string{reasonRecordMissing, reasonRecordCorrupt, reasonRegionMismatch, reasonRestorePending,
	reasonRevisionRollback, reasonRegistryConflict, reasonRegistryCorrupt, reasonRegistryUnconfirm}

// identity checks the region record (and the registry claim) at start and
// periodically, and guards the grant path: while it refuses, no grant is
// committed, and a grant whose etcd revision is not above every revision
// seen before it was sent is not handed out.
type identity struct {
	cli      *clientv3.Client
	prefix   string
	region   int
	reg      *clientv3.Client // nil: no registry
	regPfx   string
	now      func() time.Time
	log      *slog.Logger
	interval time.Duration
	timeout  time.Duration // bounds one registry call

	maxRev atomic.Int64 // highest etcd revision observed

	mu        sync.Mutex
	stored    regionid.Stored
	recErr    error  // the last record check's refusal (nil: ok)
	recReason string // its label
	rollback  error  // a revision rollback seen (cleared by a later fence)
	rollAt    time.Time
	regErr    error // the registry's refusal (nil: confirmed or cached)
	regReason string
	regOK     bool // last registry call answered

	refusal atomic.Pointer[error] // the combined refusal the grant path reads

	gRecordOK, gPending, gRegistryOK, gRegistryUp prometheus.Gauge
	gRefused                                      *prometheus.GaugeVec
}

func newIdentity(cfg ReplicaConfig) (*identity, error) {
	id := &identity{cli: cfg.Etcd, prefix: cfg.Prefix, region: cfg.Region, reg: cfg.RegistryEtcd,
		regPfx: cfg.RegistryPrefix, now: cfg.Now, log: cfg.Logger.With("component", "region-identity"),
		interval: cfg.RegistryCheckInterval, timeout: cfg.EtcdTimeout}
	if id.regPfx == "" {
		id.regPfx = regionid.DefaultRegistryPrefix
	}
	if id.interval == 0 {
		id.interval = DefaultRegistryCheckInterval
	}
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	id.gRecordOK = g("idrange_region_record_ok", "1 while the region record in etcd matches this replica's region and layout and decodes; 0 otherwise.")
	id.gPending = g("idrange_region_restore_pending", "1 while the region record says an etcd restore is pending (no grants until rangesvc admin restore-fence).")
	id.gRegistryOK = g("idrange_region_registry_claim_ok", "1 while the region's code is confirmed in the registry (or cached as confirmed while the registry is unreachable); 0 otherwise; absent without --registry-etcd.")
	id.gRegistryUp = g("idrange_region_registry_reachable", "1 while the last registry call answered; absent without --registry-etcd.")
	id.gRefused = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idrange_region_refused",
		Help: "1 for the reason this replica refuses to grant because of its region identity (at most one reason is 1)."}, []string{"reason"})
	cs := []prometheus.Collector{id.gRecordOK, id.gPending, id.gRefused}
	if id.reg != nil {
		cs = append(cs, id.gRegistryOK, id.gRegistryUp)
	}
	for _, c := range cs {
		if err := cfg.Registry.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range allReasons {
		id.gRefused.WithLabelValues(r)
	}
	return id, nil
}

// open is the start check: the record (created with init), then the
// registry claim. Its error stops the replica from starting.
func (id *identity) open(ctx context.Context, init, restored bool) error {
	st, err := regionid.Open(ctx, id.cli, regionid.OpenOptions{Region: id.region, Prefix: id.prefix,
		Init: init, Restored: restored, Now: id.now})
	if err != nil {
		return err
	}
	id.observe(st.Header.GetRevision())
	id.setRecord(st, nil, "")
	if st.Record.RestorePending {
		id.log.Error("restore pending: this replica grants nothing until `rangesvc admin restore-fence`", "reason", st.Record.RestoreReason)
	}
	if id.reg != nil {
		rctx, cancel := context.WithTimeout(ctx, id.timeout)
		err := id.checkRegistry(rctx)
		cancel()
		if err != nil {
			return err
		}
	}
	id.update()
	return nil
}

// check is the periodic record check (from the service's StoreCheck).
func (id *identity) check(ctx context.Context) error {
	before := id.maxRev.Load()
	st, err := regionid.Read(ctx, id.cli, id.prefix)
	switch {
	case errors.Is(err, regionid.ErrNoRecord):
		id.setRecord(regionid.Stored{}, err, reasonRecordMissing)
	case errors.Is(err, regionid.ErrCorrupt):
		id.setRecord(regionid.Stored{}, err, reasonRecordCorrupt)
	case err != nil:
		return err // etcd did not answer: the store check reports it
	default:
		id.noteRead(before, st.Header.GetRevision())
		if err := st.Record.Match(id.region); err != nil {
			id.setRecord(st, err, reasonRegionMismatch)
			break
		}
		cur := regionid.ClusterHex(st.Header.GetClusterId())
		reason := ""
		id.mu.Lock()
		if id.rollback != nil && st.Record.FencedUnixMs > id.rollAt.UnixMilli() {
			id.log.Info("restore fence seen; the revision rollback is cleared", "fenced_unix_ms", st.Record.FencedUnixMs)
			id.rollback = nil
			id.maxRev.Store(st.Header.GetRevision())
		}
		if id.rollback != nil {
			reason = id.rollback.Error()
		}
		id.mu.Unlock()
		if st.Record.EtcdClusterID != cur {
			reason = fmt.Sprintf("etcd cluster id %s differs from the record's %s (restored from a backup?)", cur, st.Record.EtcdClusterID)
		}
		if reason != "" && !st.Record.RestorePending {
			if st2, err := regionid.MarkPending(ctx, id.cli, id.prefix, reason, id.now()); err == nil {
				id.log.Error("region marked restore-pending", "reason", reason)
				st = st2
			}
		}
		id.setRecord(st, nil, "")
	}
	id.update()
	return id.err()
}

// runRegistry confirms the registry claim every interval until ctx ends.
func (id *identity) runRegistry(ctx context.Context) {
	t := time.NewTicker(id.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			cctx, cancel := context.WithTimeout(ctx, id.timeout)
			_ = id.checkRegistry(cctx)
			cancel()
			id.update()
		}
	}
}

// checkRegistry claims the region's code; an unreachable registry is
// tolerated only when the record caches a confirmed claim.
func (id *identity) checkRegistry(ctx context.Context) error {
	id.mu.Lock()
	rec := id.stored.Record
	id.mu.Unlock()
	if rec.RegionID == "" {
		return nil // no valid record: the record check refuses already
	}
	cluster, err := regionid.Claim(ctx, id.reg, id.regPfx, rec)
	id.mu.Lock()
	defer id.mu.Unlock()
	switch {
	case errors.Is(err, regionid.ErrClaimTaken):
		id.regOK, id.regErr, id.regReason = true, err, reasonRegistryConflict
	case errors.Is(err, regionid.ErrCorrupt):
		id.regOK, id.regErr, id.regReason = true, err, reasonRegistryCorrupt
	case err != nil && rec.RegistryClaimedUnixMs > 0:
		if id.regOK || id.regErr != nil {
			id.log.Warn("registry unreachable; serving on the claim cached in the region record", "err", err,
				"claimed_unix_ms", rec.RegistryClaimedUnixMs)
		}
		id.regOK, id.regErr, id.regReason = false, nil, ""
		return nil
	case err != nil:
		id.regOK, id.regErr, id.regReason = false, errors.Newf("%w; this region has no confirmed claim cached, so it does not serve until the registry answers", err), reasonRegistryUnconfirm
	default:
		id.regOK, id.regErr, id.regReason = true, nil, ""
		if rec.RegistryClusterID != regionid.ClusterHex(cluster) {
			id.mu.Unlock()
			st, cerr := regionid.ConfirmClaim(ctx, id.cli, id.prefix, cluster, id.now())
			id.mu.Lock()
			if cerr != nil {
				id.regErr, id.regReason = errors.Newf("registry confirmed the claim but caching it in the region record failed: %w", cerr), reasonRegistryUnconfirm
			} else {
				id.stored = st
				id.log.Info("region code claimed in the registry", "region", rec.Region, "region_id", rec.RegionID,
					"registry_cluster_id", regionid.ClusterHex(cluster))
			}
		}
	}
	if id.regErr != nil {
		return store.WithKind(ErrRegionRefused, id.regErr, "")
	}
	return nil
}

func (id *identity) setRecord(st regionid.Stored, err error, reason string) {
	id.mu.Lock()
	defer id.mu.Unlock()
	if err == nil || st.Header != nil {
		id.stored = st
	}
	if err == nil && st.Record.RestorePending {
		err, reason = st.Record.Pending(), reasonRestorePending
	}
	id.recErr, id.recReason = err, reason
}

// update recomputes the combined refusal and the metrics.
func (id *identity) update() {
	id.mu.Lock()
	err, reason := id.recErr, id.recReason
	if err == nil && id.rollback != nil {
		err, reason = id.rollback, reasonRevisionRollback
	}
	if err == nil && id.regErr != nil {
		err, reason = id.regErr, id.regReason
	}
	recOK := id.recErr == nil || id.recReason == reasonRestorePending
	pending := id.stored.Record.RestorePending
	regOK, regUp := id.regErr == nil, id.regOK
	id.mu.Unlock()
	if err != nil {
		e := store.WithKind(ErrRegionRefused, err, "")
		id.refusal.Store(&e)
	} else {
		id.refusal.Store(nil)
	}
	id.gRecordOK.Set(b2f(recOK))
	id.gPending.Set(b2f(pending))
	id.gRegistryOK.Set(b2f(regOK))
	id.gRegistryUp.Set(b2f(regUp))
	for _, r := range allReasons {
		id.gRefused.WithLabelValues(r).Set(b2f(r == reason))
	}
}

// err is the current refusal, or nil.
func (id *identity) err() error {
	if p := id.refusal.Load(); p != nil {
		return *p
	}
	return nil
}

// snapshot is the last record read and the current refusal (for admin
// status).
func (id *identity) snapshot() (regionid.Stored, error) {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.stored, id.recErr
}

// observe records revision rev as seen.
func (id *identity) observe(rev int64) {
	for {
		cur := id.maxRev.Load()
		if rev <= cur || id.maxRev.CompareAndSwap(cur, rev) {
			return
		}
	}
}

// noteRead checks a read's revision against the highest revision seen
// before the read was sent: etcd's revisions never go back, except when the
// cluster was restored from a backup.
func (id *identity) noteRead(before, rev int64) error {
	if rev < before {
		return id.trip(before, rev)
	}
	id.observe(rev)
	return nil
}

// noteWrite is noteRead for a successful write, whose revision must be
// above every revision seen before it was sent.
func (id *identity) noteWrite(before, rev int64) error {
	if rev <= before {
		return id.trip(before, rev)
	}
	id.observe(rev)
	return nil
}

func (id *identity) trip(before, rev int64) error {
	err := errors.Newf("etcd revision went back from %d to %d (restored from a backup?): %w", before, rev, regionid.ErrRestorePending)
	id.mu.Lock()
	if id.rollback == nil {
		id.rollback, id.rollAt = err, id.now()
		id.log.Error("etcd revision went back; refusing to grant until a restore fence", "seen", before, "now", rev)
	}
	id.mu.Unlock()
	id.update()
	return store.WithKind(ErrRegionRefused, err, "")
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// guardStorage is the replica's storage under its store.Store: it refuses
// every high-water commit while the identity refuses, and checks the
// revision of each answer against those seen before, so that a grant from a
// restored (rolled back) etcd is never handed out: the commit's error makes
// its outcome unknown and the Store burns the block.
type guardStorage struct {
	store.BatchStorage
	id *identity
}

var _ store.BatchStorage = guardStorage{}

func (g guardStorage) Scan(ctx context.Context, region int) (store.RegionView, error) {
	before := g.id.maxRev.Load()
	v, err := g.BatchStorage.Scan(ctx, region)
	if err == nil {
		err = g.id.noteRead(before, v.Rev)
	}
	return v, err
}

func (g guardStorage) Code(ctx context.Context, region, worker int) (store.CodeView, error) {
	before := g.id.maxRev.Load()
	v, err := g.BatchStorage.Code(ctx, region, worker)
	if err == nil {
		err = g.id.noteRead(before, v.Rev)
	}
	return v, err
}

func (g guardStorage) CreateOwner(ctx context.Context, region, worker int, highWaterRev int64, value []byte, lease int64) (int64, bool, error) {
	before := g.id.maxRev.Load()
	tok, ok, err := g.BatchStorage.CreateOwner(ctx, region, worker, highWaterRev, value, lease)
	if err == nil && ok {
		err = g.id.noteWrite(before, tok)
	}
	return tok, ok, err
}

func (g guardStorage) CommitHighWater(ctx context.Context, region, worker int, c store.HighWaterCommit) (int64, bool, store.CodeView, error) {
	if err := g.id.err(); err != nil {
		return 0, false, store.CodeView{}, err
	}
	before := g.id.maxRev.Load()
	rev, ok, fresh, err := g.BatchStorage.CommitHighWater(ctx, region, worker, c)
	switch {
	case err != nil:
	case ok:
		err = g.id.noteWrite(before, rev)
	default:
		err = g.id.noteRead(before, fresh.Rev)
	}
	return rev, ok, fresh, err
}

func (g guardStorage) CommitHighWaters(ctx context.Context, ops []store.GrantOp) ([]store.GrantResult, error) {
	if err := g.id.err(); err != nil {
		return nil, err
	}
	before := g.id.maxRev.Load()
	res, err := g.BatchStorage.CommitHighWaters(ctx, ops)
	if err != nil {
		return res, err
	}
	for _, r := range res {
		if r.OK {
			err = g.id.noteWrite(before, r.Rev)
		} else {
			err = g.id.noteRead(before, r.Fresh.Rev)
		}
		if err != nil {
			return nil, err
		}
	}
	return res, nil
}

// DefaultRestoreMargin is added to the max lead and the max block span when
// a restore fence lifts the high-water marks: it covers clock differences
// between the replicas that granted before the restore and this one.
const DefaultRestoreMargin = 5 * time.Second

// regionRecord reads the region record afresh for admin status, with this
// replica's current refusal (nil: it may grant).
func (r *Replica) regionRecord(ctx context.Context) (regionid.Stored, error, error) {
	st, err := regionid.Read(ctx, r.cfg.Etcd, r.cfg.Prefix)
	return st, err, r.ident.err()
}

// restoreFence runs regionid.Fence with this replica's policy: every
// high-water mark to at least now + MaxLead + MaxBlock's span + margin
// (DefaultRestoreMargin when 0), then re-checks health at once.
func (r *Replica) restoreFence(ctx context.Context, margin time.Duration) (regionid.FenceResult, error) {
	if margin <= 0 {
		margin = DefaultRestoreMargin
	}
	p := r.store.Policy()
	span := time.Duration((p.MaxBlock+segment.PerMs-1)/segment.PerMs) * time.Millisecond
	now := r.cfg.Now()
	to := now.Add(p.MaxLead + span + margin)
	res, err := regionid.Fence(ctx, r.cfg.Etcd, regionid.FenceOptions{Prefix: r.cfg.Prefix, Region: r.cfg.Region, To: to, Now: now})
	if err != nil {
		return res, err
	}
	r.cfg.Logger.Warn("restore fence done: every high-water mark lifted", "to", to.UTC().Format(time.RFC3339Nano),
		"codes_lifted", res.Lifted, "txns", res.Txns, "max_lead", p.MaxLead, "block_span", span, "margin", margin)
	r.svc.Check(ctx)
	return res, nil
}
