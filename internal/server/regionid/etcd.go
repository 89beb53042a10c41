package regionid

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cockroachdb/errors"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/server/store/etcdstore"
	"github.com/idrange/idrange/snowflake"
)

// Stored is a record as read from etcd: the value, its ModRevision (0:
// absent) and the header of the read (cluster id and revision).
type Stored struct {
	Record      Record
	ModRevision int64
	Header      *etcdserverpb.ResponseHeader
}

// Read reads the record under prefix with one linearizable Get. An absent
// record wraps ErrNoRecord (Stored.Header is still set), a corrupt one
// ErrCorrupt; both name the key.
func Read(ctx context.Context, cli *clientv3.Client, prefix string) (Stored, error) {
	key := Key(prefix)
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return Stored{}, errors.Newf("read region record %s: %w", key, err)
	}
	st := Stored{Header: resp.Header}
	if len(resp.Kvs) == 0 {
		return st, errors.Newf("etcd cluster %s has no region record at %s: %w", ClusterHex(resp.Header.ClusterId), key, ErrNoRecord)
	}
	rec, err := Decode(resp.Kvs[0].Value)
	if err != nil {
		return st, errors.Newf("etcd key %s: %w", key, err)
	}
	st.Record, st.ModRevision = rec, resp.Kvs[0].ModRevision
	return st, nil
}

// OpenOptions is what a replica's start check needs.
type OpenOptions struct {
	// Region is the replica's --region.
	Region int
	// Prefix is the deployment's key prefix (etcdstore.DefaultPrefix if "").
	Prefix string
	// Init creates the record when etcd has none (serve --init-region, or
	// the embedded etcd, which is new by construction). Keys of the
	// deployment already under Prefix (data from before region records)
	// are adopted only if they all belong to Region.
	Init bool
	// Restored marks the region restore-pending (serve --restored): the
	// operator knows this etcd was restored from a backup.
	Restored bool
	// Now is the wall clock. Default time.Now.
	Now func() time.Time
}

// Open is a replica's start check: it reads (or, with Init, creates) the
// record and checks it against the replica. A record of another region or
// layout wraps ErrMismatch naming both codes; no record without Init wraps
// ErrNoRecord; a corrupt record ErrCorrupt. A record found on another etcd
// cluster than the one it names (a restore or a copy of the data) is
// marked restore-pending, as is every record with Restored: Open then
// succeeds, and the caller refuses to grant while Record.Pending is set.
func Open(ctx context.Context, cli *clientv3.Client, o OpenOptions) (Stored, error) {
	if o.Prefix == "" {
		o.Prefix = etcdstore.DefaultPrefix
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	for range 5 {
		st, err := Read(ctx, cli, o.Prefix)
		switch {
		case isNoRecord(err) && !o.Init:
			return st, errors.Newf("%w; if this is region %d's new, empty etcd cluster, start one replica with --init-region (otherwise check --etcd and --key-prefix)", err, o.Region)
		case isNoRecord(err):
			if err := checkAdoptable(ctx, cli, o.Prefix, o.Region); err != nil {
				return st, err
			}
			if _, err := create(ctx, cli, o.Prefix, o.Region, st.Header.ClusterId, o.Now()); err != nil {
				return st, err
			}
			continue // read back what is stored, whoever wrote it
		case err != nil:
			return st, err
		}
		if err := st.Record.Match(o.Region); err != nil {
			return st, err
		}
		cur := ClusterHex(st.Header.ClusterId)
		reason := ""
		switch {
		case st.Record.EtcdClusterID != cur:
			reason = fmt.Sprintf("etcd cluster id %s differs from the record's %s (restored from a backup?)", cur, st.Record.EtcdClusterID)
		case o.Restored:
			reason = "a replica started with --restored"
		}
		if reason != "" && !st.Record.RestorePending {
			return MarkPending(ctx, cli, o.Prefix, reason, o.Now())
		}
		return st, nil
	}
	return Stored{}, errors.Newf("region record %s changed under every read; retry", Key(o.Prefix))
}

func isNoRecord(err error) bool { return err != nil && errorsIs(err, ErrNoRecord) }

// checkAdoptable refuses to initialise a prefix that holds another region's
// keys.
func checkAdoptable(ctx context.Context, cli *clientv3.Client, prefix string, region int) error {
	resp, err := cli.Get(ctx, prefix+"r", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return errors.Newf("list keys under %sr: %w", prefix, err)
	}
	for _, kv := range resp.Kvs {
		if string(kv.Key) == Key(prefix) {
			continue
		}
		if r, ok := parseRegionKey(string(kv.Key), prefix); !ok || r != region {
			return errors.Newf("etcd has no region record but holds key %s, which is not region %d's: refusing to initialise it as region %d: %w", kv.Key, region, region, ErrMismatch)
		}
	}
	return nil
}

// create writes a new record if none exists (create-if-absent).
func create(ctx context.Context, cli *clientv3.Client, prefix string, region int, cluster uint64, now time.Time) (bool, error) {
	id, err := NewRegionID()
	if err != nil {
		return false, err
	}
	rec := Record{Version: RecordVersion, Region: region, RegionID: id, CreatedUnixMs: now.UnixMilli(),
		Layout: LayoutVersion, EtcdClusterID: ClusterHex(cluster)}
	b, err := rec.Encode()
	if err != nil {
		return false, err
	}
	key := Key(prefix)
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(b))).Commit()
	if err != nil {
		return false, errors.Newf("create region record %s: %w", key, err)
	}
	return resp.Succeeded, nil
}

// update applies change to the stored record with a compare-and-set on its
// ModRevision, retrying a few times when another writer got there first.
// change returns false to leave the record as it is.
func update(ctx context.Context, cli *clientv3.Client, prefix string, change func(*Record, *etcdserverpb.ResponseHeader) bool) (Stored, error) {
	key := Key(prefix)
	for range 5 {
		st, err := Read(ctx, cli, prefix)
		if err != nil {
			return st, err
		}
		rec := st.Record
		if !change(&rec, st.Header) {
			return st, nil
		}
		b, err := rec.Encode()
		if err != nil {
			return st, err
		}
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", st.ModRevision)).
			Then(clientv3.OpPut(key, string(b))).Commit()
		if err != nil {
			return st, errors.Newf("write region record %s: %w", key, err)
		}
		if resp.Succeeded {
			return Stored{Record: rec, ModRevision: resp.Header.Revision, Header: resp.Header}, nil
		}
	}
	return Stored{}, errors.Newf("region record %s changed under every write; retry", key)
}

// MarkPending sets the record restore-pending with reason (kept if one is
// already pending): from then on no replica of the region grants until a
// restore fence.
func MarkPending(ctx context.Context, cli *clientv3.Client, prefix, reason string, now time.Time) (Stored, error) {
	if len(reason) > maxReasonLen {
		reason = reason[:maxReasonLen]
	}
	return update(ctx, cli, prefix, func(r *Record, _ *etcdserverpb.ResponseHeader) bool {
		if r.RestorePending {
			return false
		}
		r.RestorePending, r.RestoreReason, r.RestoreSinceUnixMs = true, reason, now.UnixMilli()
		return true
	})
}

// ConfirmClaim records that the registry (cluster id registry) confirmed the
// region's claim at now. It writes only when the cached claim changes
// (another registry, or none before), so a periodic confirmation costs no
// write.
func ConfirmClaim(ctx context.Context, cli *clientv3.Client, prefix string, registry uint64, now time.Time) (Stored, error) {
	return update(ctx, cli, prefix, func(r *Record, _ *etcdserverpb.ResponseHeader) bool {
		if r.RegistryClusterID == ClusterHex(registry) {
			return false
		}
		r.RegistryClusterID, r.RegistryClaimedUnixMs = ClusterHex(registry), now.UnixMilli()
		return true
	})
}

// FenceOptions is a restore fence's input.
type FenceOptions struct {
	Prefix string
	Region int
	// To is the time every high-water mark of the region is lifted to (at
	// least): now + max lead + max block span + margin.
	To time.Time
	// Now is the fence's time (the record's FencedUnixMs).
	Now time.Time
}

// FenceResult is what a fence did.
type FenceResult struct {
	Stored Stored
	// Lifted counts the codes whose high-water mark was raised; Txns the
	// etcd transactions that took.
	Lifted, Txns int
}

// codesPerTxn is how many codes one fence transaction lifts: per code one
// compare and one put, plus one compare on the record, 2 x 50 + 1 = 101
// operations, under etcd's default --max-txn-ops of 128 however compares and
// ops are counted.
const codesPerTxn = 50

var _ = [1]struct{}{}[(2*codesPerTxn+1)/129] // 2 x codesPerTxn + 1 <= 128

// Fence is the restore fence. In order:
//
//  1. the record is marked restore-pending (if it is not already), so no
//     replica grants while the fence runs;
//  2. every worker code's high-water mark below To (absent ones too: a
//     code unused in the backup may have been used after it) is raised to
//     To, codesPerTxn codes per transaction, each put compared on the HWM's
//     ModRevision and on the record's (still pending, unchanged);
//  3. the record is cleared of the pending mark, stamped with the fence and
//     with the current etcd cluster id, compared on its ModRevision.
//
// The lift only raises values, so a fence that fails half way leaves every
// code at or above where it was and the region still pending: run it
// again. A corrupt high-water mark fails the fence (it names the key): the
// code is stopped until repaired, and a repair must respect the fence.
func Fence(ctx context.Context, cli *clientv3.Client, o FenceOptions) (FenceResult, error) {
	if o.Prefix == "" {
		o.Prefix = etcdstore.DefaultPrefix
	}
	st, err := MarkPending(ctx, cli, o.Prefix, "restore fence in progress", o.Now)
	if err != nil {
		return FenceResult{}, err
	}
	if err := st.Record.Match(o.Region); err != nil {
		return FenceResult{}, err
	}
	stg, err := etcdstore.New(cli, etcdstore.Config{Prefix: o.Prefix})
	if err != nil {
		return FenceResult{}, err
	}
	toMs := snowflake.MsSince(o.To)
	if toMs <= 0 || toMs > snowflake.MaxTimestamp {
		return FenceResult{}, errors.Newf("restore fence: target %s is outside the ID layout's time range", o.To.UTC().Format(time.RFC3339))
	}
	target := toMs << snowflake.SequenceBits
	key := Key(o.Prefix)
	res := FenceResult{}
	for lo := 0; lo <= snowflake.MaxWorker; lo += codesPerTxn {
		hi := min(lo+codesPerTxn, snowflake.MaxWorker+1)
		ops := []clientv3.Op{}
		for w := lo; w < hi; w++ {
			ops = append(ops, clientv3.OpGet(stg.HighWaterKey(o.Region, w)))
		}
		read, err := cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return res, errors.Newf("restore fence: read high-water marks: %w", err)
		}
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", st.ModRevision)}
		puts := []clientv3.Op{}
		for i, w := 0, lo; w < hi; i, w = i+1, w+1 {
			hk := stg.HighWaterKey(o.Region, w)
			var modRev int64
			if kvs := read.Responses[i].GetResponseRange().GetKvs(); len(kvs) > 0 {
				v, err := store.DecodeHighWater(kvs[0].Value)
				if err != nil {
					return res, errors.Newf("restore fence: etcd key %s: %w", hk, err)
				}
				if v >= target {
					continue
				}
				modRev = kvs[0].ModRevision
			}
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(hk), "=", modRev))
			puts = append(puts, clientv3.OpPut(hk, store.EncodeHighWater(target)))
		}
		if len(puts) == 0 {
			continue
		}
		resp, err := cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
		if err != nil {
			return res, errors.Newf("restore fence: lift codes %d..%d (outcome unknown; run the fence again): %w", lo, hi-1, err)
		}
		if !resp.Succeeded {
			return res, errors.Newf("restore fence: codes %d..%d or the region record changed during the fence; run it again", lo, hi-1)
		}
		res.Lifted += len(puts)
		res.Txns++
	}
	rec := st.Record
	rec.RestorePending, rec.RestoreReason, rec.RestoreSinceUnixMs = false, "", 0
	rec.FencedUnixMs, rec.FencedToUnixMs = o.Now.UnixMilli(), o.To.UnixMilli()
	rec.EtcdClusterID = ClusterHex(st.Header.ClusterId)
	b, err := rec.Encode()
	if err != nil {
		return res, err
	}
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", st.ModRevision)).
		Then(clientv3.OpPut(key, string(b))).Commit()
	if err != nil {
		return res, errors.Newf("restore fence: clear the pending mark (outcome unknown; run the fence again): %w", err)
	}
	if !resp.Succeeded {
		return res, errors.Newf("restore fence: the region record changed during the fence; run it again")
	}
	res.Txns++
	res.Stored = Stored{Record: rec, ModRevision: resp.Header.Revision, Header: resp.Header}
	return res, nil
}
