// Package etcdstore is store.Storage on etcd: the production home of the
// per-code leases and high-water marks. The grant rule and the fencing
// decisions live in store.Store; this package only maps its reads and
// compare-and-set writes onto etcd transactions.
//
//	stg, err := etcdstore.New(cli, etcdstore.Config{})
//	store, err := store.New(stg, store.Config{})
//
// Key layout under a prefix P (default DefaultPrefix):
//
//	P + "r<region>/lease/<worker, 3 digits>"   owner record, attached to the etcd lease
//	P + "r<region>/hwm/<worker, 3 digits>"     high-water mark, no lease (forever)
//	P + "r<region>/contend/<worker, 3 digits>" contention signal (value unused)
//
// etcd's revision is the fencing token: the CreateRevision of a lease key
// names one owner for ever, and every grant's Txn compares it together with
// the ModRevisions of the lease, HWM and contention keys. Grants for
// different codes that the Store commits together go in one Txn of nested,
// separately fenced Txns (CommitHighWaters): one raft entry for many. A Txn
// whose call fails may still have committed; this package reports the error
// and the Store treats the outcome as unknown (every block it carried is
// burned, never returned).
package etcdstore

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/cockroachdb/errors"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// DefaultPrefix is the etcd key prefix of format version 1.
const DefaultPrefix = "/idrange/v1/"

// ValidatePrefix is the rule for a key prefix: it starts and ends with "/",
// so prefixes of two deployments are never prefixes of each other's keys
// by accident. The error wraps segment.ErrInvalid.
func ValidatePrefix(p string) error {
	if !strings.HasPrefix(p, "/") || !strings.HasSuffix(p, "/") {
		return errors.Newf("key prefix %q must start and end with /: %w", p, segment.ErrInvalid)
	}
	return nil
}

// Config configures a Storage. Zero fields take the documented defaults.
type Config struct {
	// Prefix of every key (ValidatePrefix: starts and ends with "/").
	// Default DefaultPrefix.
	Prefix string
	// Logger receives warnings (keys under the prefix this layout does not
	// produce). Default: discard.
	Logger *slog.Logger
}

// Storage is store.Storage on an etcd client. It does not own the client.
type Storage struct {
	cli  *clientv3.Client
	keys keys
	log  *slog.Logger
}

var _ store.BatchStorage = (*Storage)(nil)

// New returns a Storage over cli. A bad field is an error wrapping
// segment.ErrInvalid that names it.
func New(cli *clientv3.Client, cfg Config) (*Storage, error) {
	if cli == nil {
		return nil, errors.Newf("etcdstore: nil etcd client: %w", segment.ErrInvalid)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if err := ValidatePrefix(cfg.Prefix); err != nil {
		return nil, errors.Newf("etcdstore: Config.Prefix: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Storage{cli: cli, keys: keys{prefix: cfg.Prefix}, log: cfg.Logger}, nil
}

// Prefix is the key prefix in use.
func (s *Storage) Prefix() string { return s.keys.prefix }

// LeaseKey is the etcd key holding the owner record of (region, worker).
func (s *Storage) LeaseKey(region, worker int) string { return s.keys.lease(region, worker) }

// HighWaterKey is the etcd key holding the high-water mark of (region, worker).
func (s *Storage) HighWaterKey(region, worker int) string { return s.keys.hwm(region, worker) }

// ContentionKey is the etcd key of the contention signal of (region, worker).
func (s *Storage) ContentionKey(region, worker int) string { return s.keys.contend(region, worker) }

// Grant implements store.Storage: an etcd lease of ttl (whole seconds).
func (s *Storage) Grant(ctx context.Context, ttl time.Duration) (int64, time.Duration, error) {
	resp, err := s.cli.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		return 0, 0, err
	}
	return int64(resp.ID), time.Duration(resp.TTL) * time.Second, nil
}

// KeepAlive implements store.Storage with one KeepAliveOnce.
func (s *Storage) KeepAlive(ctx context.Context, id int64) (time.Duration, error) {
	resp, err := s.cli.KeepAliveOnce(ctx, clientv3.LeaseID(id))
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return 0, nil
	case err != nil:
		return 0, err
	case resp.TTL <= 0:
		return 0, nil
	}
	return time.Duration(resp.TTL) * time.Second, nil
}

// Revoke implements store.Storage.
func (s *Storage) Revoke(ctx context.Context, id int64) error {
	if _, err := s.cli.Revoke(ctx, clientv3.LeaseID(id)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return err
	}
	return nil
}

// Scan implements store.Storage: one Txn of two prefix reads.
func (s *Storage) Scan(ctx context.Context, region int) (store.RegionView, error) {
	lp, hp := s.keys.leasePrefix(region), s.keys.hwmPrefix(region)
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(lp, clientv3.WithPrefix()),
		clientv3.OpGet(hp, clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return store.RegionView{}, err
	}
	v := store.RegionView{Rev: resp.Header.Revision, Owners: map[int]store.Entry{}, HighWaters: map[int]store.Entry{}}
	for i, into := range []map[int]store.Entry{v.Owners, v.HighWaters} {
		prefix := []string{lp, hp}[i]
		for _, kv := range resp.Responses[i].GetResponseRange().Kvs {
			w, ok := workerOf(kv.Key, prefix)
			if !ok {
				s.log.Warn("unexpected key under prefix; ignored", "prefix", prefix, "key", string(kv.Key))
				continue
			}
			into[w] = *entry(kv)
		}
	}
	return v, nil
}

var _ store.HighWaterWatcher = (*Storage)(nil)

// WatchHighWaters implements store.HighWaterWatcher with an etcd watch on
// the region's high-water prefix from revision after+1 (requiring a
// leader, so a member cut off from the cluster ends the watch rather than
// going quiet).
func (s *Storage) WatchHighWaters(ctx context.Context, region int, after int64, f func(worker int, e store.Entry)) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	hp := s.keys.hwmPrefix(region)
	for resp := range s.cli.Watch(wctx, hp, clientv3.WithPrefix(), clientv3.WithRev(after+1)) {
		if err := resp.Err(); err != nil {
			return errors.Wrapf(err, "watch %s from revision %d", hp, after+1)
		}
		for _, ev := range resp.Events {
			w, ok := workerOf(ev.Kv.Key, hp)
			if !ok {
				continue
			}
			e := *entry(ev.Kv)
			if ev.Type == mvccpb.DELETE {
				e.Value, e.CreateRevision = nil, 0
			}
			f(w, e)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.Newf("watch %s: closed by the etcd client", hp)
}

// Code implements store.Storage: one Txn of three reads.
func (s *Storage) Code(ctx context.Context, region, worker int) (store.CodeView, error) {
	resp, err := s.cli.Txn(ctx).Then(s.codeOps(region, worker)...).Commit()
	if err != nil {
		return store.CodeView{}, err
	}
	return viewFrom(resp.Header.Revision, resp.Responses), nil
}

// codeOps reads a code's lease, HWM and contention keys, in that order.
func (s *Storage) codeOps(region, worker int) []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpGet(s.keys.lease(region, worker)),
		clientv3.OpGet(s.keys.hwm(region, worker)),
		clientv3.OpGet(s.keys.contend(region, worker), clientv3.WithKeysOnly()),
	}
}

// viewFrom builds a CodeView at revision rev from the responses of a Txn
// (or nested Txn) whose first three ops were codeOps.
func viewFrom(rev int64, responses []*etcdserverpb.ResponseOp) store.CodeView {
	v := store.CodeView{Rev: rev, Owner: first(responses[0]), HighWater: first(responses[1])}
	if c := first(responses[2]); c != nil {
		v.Contention = c.ModRevision
	}
	return v
}

// CreateOwner implements store.Storage: If the lease key does not exist
// (CreateRevision 0) and the HWM key is at highWaterRev, put the record with
// the lease. The token is the Txn's revision.
func (s *Storage) CreateOwner(ctx context.Context, region, worker int, highWaterRev int64, value []byte, lease int64) (int64, bool, error) {
	lk, hk := s.keys.lease(region, worker), s.keys.hwm(region, worker)
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(lk), "=", 0),
			clientv3.Compare(clientv3.ModRevision(hk), "=", highWaterRev)).
		Then(clientv3.OpPut(lk, string(value), clientv3.WithLease(clientv3.LeaseID(lease)))).
		Commit()
	if err != nil {
		return 0, false, err
	}
	return resp.Header.Revision, resp.Succeeded, nil
}

// CommitHighWater implements store.Storage: the grant Txn. Its Else reads
// the code afresh (and writes the contention key if asked), so a failed
// compare costs no extra round trip.
func (s *Storage) CommitHighWater(ctx context.Context, region, worker int, c store.HighWaterCommit) (int64, bool, store.CodeView, error) {
	cmps, then, orElse := s.grantTxn(region, worker, c)
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(then...).Else(orElse...).Commit()
	if err != nil {
		return 0, false, store.CodeView{}, err
	}
	r := grantResult(resp.Header.Revision, resp.Succeeded, resp.Responses, c)
	return r.Rev, r.OK, r.Fresh, nil
}

// MaxBatch is the most grants one CommitHighWaters sends in one Txn: 12.
// etcd refuses a Txn with more than --max-txn-ops operations (default 128).
// etcd 3.4 to 3.7 count each nesting level on its own (the outer Txn holds
// one op per grant, each nested one at most 4 compares and 4 ops), so up to
// 124 grants would pass; the bound counts every operation of the batch
// instead, nested ones included, so that it holds under any counting:
// per grant 1 nested Txn + 4 compares + 1 put + 4 else ops (3 reads and the
// contention put) = 10 operations, and 12 x 10 = 120 <= 128.
const MaxBatch = 12

// opsPerGrant is what MaxBatch counts per grant (see there).
const opsPerGrant = 10

var _ = [1]struct{}{}[MaxBatch*opsPerGrant/129] // MaxBatch x opsPerGrant <= 128

// MaxBatch implements store.BatchStorage.
func (s *Storage) MaxBatch() int { return MaxBatch }

// CommitHighWaters implements store.BatchStorage: one Txn with no compares
// of its own whose Then holds one nested Txn per grant (etcd's OpTxn, since
// etcd 3.3), each with exactly CommitHighWater's compares, Then and Else. A
// nested Txn whose compares fail takes its Else (the fresh read) without
// failing the others; all the batch's writes share one revision, one raft
// entry. A batch of one is sent as CommitHighWater's plain Txn.
func (s *Storage) CommitHighWaters(ctx context.Context, ops []store.GrantOp) ([]store.GrantResult, error) {
	switch {
	case len(ops) == 0:
		return nil, nil
	case len(ops) > MaxBatch:
		return nil, errors.Newf("etcdstore: batch of %d grants, more than %d: %w", len(ops), MaxBatch, segment.ErrInvalid)
	case len(ops) == 1:
		op := ops[0]
		rev, ok, fresh, err := s.CommitHighWater(ctx, op.Region, op.Worker, op.Commit)
		if err != nil {
			return nil, err
		}
		return []store.GrantResult{{Rev: rev, OK: ok, Fresh: fresh}}, nil
	}
	nested := make([]clientv3.Op, len(ops))
	for i, op := range ops {
		cmps, then, orElse := s.grantTxn(op.Region, op.Worker, op.Commit)
		nested[i] = clientv3.OpTxn(cmps, then, orElse)
	}
	resp, err := s.cli.Txn(ctx).Then(nested...).Commit()
	if err != nil {
		return nil, err
	}
	if len(resp.Responses) != len(ops) {
		return nil, errors.Newf("etcdstore: batch Txn answered %d of %d grants", len(resp.Responses), len(ops))
	}
	out := make([]store.GrantResult, len(ops))
	for i, op := range ops {
		r := resp.Responses[i].GetResponseTxn()
		if r == nil || (!r.Succeeded && len(r.Responses) < 3) {
			return nil, errors.Newf("etcdstore: batch Txn answer %d is not a grant's transaction", i)
		}
		out[i] = grantResult(resp.Header.Revision, r.Succeeded, r.Responses, op.Commit)
	}
	return out, nil
}

// grantTxn is one grant's transaction: compare the owner's CreateRevision
// (the token) and ModRevision and the HWM's and contention key's
// ModRevisions; then put the HWM; else read the code afresh (and write the
// contention key if asked).
func (s *Storage) grantTxn(region, worker int, c store.HighWaterCommit) (cmps []clientv3.Cmp, then, orElse []clientv3.Op) {
	lk, hk, ck := s.keys.lease(region, worker), s.keys.hwm(region, worker), s.keys.contend(region, worker)
	orElse = s.codeOps(region, worker)
	if c.Signal {
		orElse = append(orElse, clientv3.OpPut(ck, "v1"))
	}
	cmps = []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(lk), "=", c.Token),
		clientv3.Compare(clientv3.ModRevision(lk), "=", c.OwnerRev),
		clientv3.Compare(clientv3.ModRevision(hk), "=", c.HighWaterRev),
		clientv3.Compare(clientv3.ModRevision(ck), "=", c.ContentionRev),
	}
	return cmps, []clientv3.Op{clientv3.OpPut(hk, string(c.Value))}, orElse
}

// grantResult reads one grant's outcome from its (possibly nested) Txn
// response at store revision rev.
func grantResult(rev int64, succeeded bool, responses []*etcdserverpb.ResponseOp, c store.HighWaterCommit) store.GrantResult {
	if succeeded {
		return store.GrantResult{Rev: rev, OK: true}
	}
	v := viewFrom(rev, responses)
	if c.Signal {
		// Our Else wrote the contention key at this revision.
		v.Contention = rev
	}
	return store.GrantResult{Fresh: v}
}

// DeleteOwner implements store.Storage: delete the lease key if its
// CreateRevision is token and it is attached to lease, else read it.
func (s *Storage) DeleteOwner(ctx context.Context, region, worker int, token, lease int64) (bool, store.CodeView, error) {
	lk := s.keys.lease(region, worker)
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(lk), "=", token),
			clientv3.Compare(clientv3.LeaseValue(lk), "=", clientv3.LeaseID(lease))).
		Then(clientv3.OpDelete(lk)).
		Else(clientv3.OpGet(lk)).
		Commit()
	if err != nil {
		return false, store.CodeView{}, err
	}
	if resp.Succeeded {
		return true, store.CodeView{}, nil
	}
	return false, store.CodeView{Rev: resp.Header.Revision, Owner: first(resp.Responses[0])}, nil
}

// first is the single key a Get op in a Txn returned, or nil.
func first(r *etcdserverpb.ResponseOp) *store.Entry {
	kvs := r.GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return nil
	}
	return entry(kvs[0])
}

func entry(kv *mvccpb.KeyValue) *store.Entry {
	return &store.Entry{
		Key: string(kv.Key), Value: kv.Value,
		CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Lease: kv.Lease,
	}
}

type keys struct{ prefix string }

func (k keys) contend(region, worker int) string {
	return fmt.Sprintf("%sr%d/contend/%03d", k.prefix, region, worker)
}

func (k keys) leasePrefix(region int) string { return fmt.Sprintf("%sr%d/lease/", k.prefix, region) }
func (k keys) hwmPrefix(region int) string   { return fmt.Sprintf("%sr%d/hwm/", k.prefix, region) }
func (k keys) lease(region, worker int) string {
	return fmt.Sprintf("%s%03d", k.leasePrefix(region), worker)
}
func (k keys) hwm(region, worker int) string {
	return fmt.Sprintf("%s%03d", k.hwmPrefix(region), worker)
}

// workerOf parses the worker code at the end of a key listed under prefix;
// ok is false for any key this layout does not produce.
func workerOf(key []byte, prefix string) (int, bool) {
	s, found := strings.CutPrefix(string(key), prefix)
	if !found || len(s) != 3 {
		return 0, false
	}
	w := 0
	for i := 0; i < 3; i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		w = w*10 + int(s[i]-'0')
	}
	if w > snowflake.MaxWorker {
		return 0, false
	}
	return w, true
}
