// Package admin is the AdminService of a range-service replica: the
// operator's view of a region (rangesvc admin status, leases, fence, alarm)
// served by every replica next to the RangeService.
//
// The admin commands read and write etcd through the service, not with an
// etcd client of their own, because:
//   - the service is the one home of the stored record formats and their
//     strict decoding (package segment): an operator's tool that decoded
//     etcd keys itself would be a second decoder to keep in step, and a
//     lenient one could show a corrupt high-water mark as a number;
//   - operators need no etcd credentials, only access to a replica;
//   - the admin RPCs can be gated by admin identities (mTLS) in one place;
//   - any replica answers, also behind a load balancer.
//
// Fence goes through store.Store.Fence: a compare-and-delete on the
// code's fencing token and etcd lease, so it never removes an owner that
// took the code after the operator looked. Status and ListLeases read one
// consistent snapshot of the region (store.Store.Snapshot); the etcd
// lease TTLs, member status and alarms come from the replica's etcd client.
package admin

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/cockroachdb/errors"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/server/authz"
	"github.com/idrange/idrange/internal/server/regionid"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// DefaultTimeout bounds one admin RPC's work on etcd when the caller set no
// shorter deadline.
const DefaultTimeout = 10 * time.Second

// memberTimeout bounds one endpoint's Maintenance Status in Status, so one
// dead member does not hold up the whole answer.
const memberTimeout = 3 * time.Second

// ttlParallel bounds the concurrent etcd TimeToLive calls of one ListLeases.
const ttlParallel = 16

// TTL placeholders in a LeaseRow.
const (
	// TTLGone: etcd says the lease does not exist (any more).
	TTLGone = -1
	// TTLUnknown: etcd did not answer the TimeToLive call.
	TTLUnknown = -2
)

// Config configures a Server. Region, Store and Etcd are required.
type Config struct {
	// Region is the replica's region (0..3).
	Region int
	// Store is the replica's store.Store: snapshots and fencing.
	Store *store.Store
	// Etcd is the replica's etcd client: lease TTLs, member status, alarms.
	Etcd *clientv3.Client
	// Serving reports the replica's health (Status.serving). Default: true.
	Serving func() bool
	// Now is the service clock leads are measured against. Default
	// time.Now.
	Now func() time.Time
	// Timeout bounds each RPC's work. Default DefaultTimeout.
	Timeout time.Duration
	// Logger receives one audit line per fence, restore fence and alarm
	// disarm, refused or failed ones included. Default: discard.
	Logger *slog.Logger
	// RegionRecord, if set, reads the region record for Status: the stored
	// record, the error reading or decoding it, and the replica's current
	// refusal to grant (nil: it may grant).
	RegionRecord func(ctx context.Context) (st regionid.Stored, recordErr, refusal error)
	// RestoreFence, if set, runs the restore fence with margin (0: the
	// replica's default). nil: RestoreFence answers Unimplemented.
	RestoreFence func(ctx context.Context, margin time.Duration) (regionid.FenceResult, error)
}

// Server implements idrangev1.AdminServiceServer.
type Server struct {
	idrangev1.UnimplementedAdminServiceServer
	cfg Config
	log *slog.Logger
}

// New validates cfg and returns a Server.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Region < 0 || cfg.Region > snowflake.MaxRegion:
		return nil, errors.Newf("admin: Config.Region %d not in 0..%d", cfg.Region, snowflake.MaxRegion)
	case cfg.Store == nil:
		return nil, errors.New("admin: Config.Store is required")
	case cfg.Etcd == nil:
		return nil, errors.New("admin: Config.Etcd is required")
	case cfg.Timeout < 0:
		return nil, errors.Newf("admin: Config.Timeout %v is negative", cfg.Timeout)
	}
	if cfg.Serving == nil {
		cfg.Serving = func() bool { return true }
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, log: cfg.Logger.With("component", "admin", "region", cfg.Region)}, nil
}

// Register registers the AdminService on srv.
func (s *Server) Register(srv grpc.ServiceRegistrar) {
	idrangev1.RegisterAdminServiceServer(srv, s)
}

// toStatus maps an error to a gRPC status: segment's sentinels as the
// RangeService maps them (internal/wire), etcd's own statuses kept.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	return wire.ToStatus(err)
}

// etcdErr marks an etcd client error as the store being unavailable,
// keeping etcd's message.
func etcdErr(err error, what string) error {
	return store.Unavailable(err, "%s", what)
}

// hwmTime is the timestamp of a high-water mark (linear space, L =
// ms<<12|seq).
func hwmTime(hwm int64) time.Time { return snowflake.MsTime(hwm >> snowflake.SequenceBits) }

// Status summarises the region and this replica.
func (s *Server) Status(ctx context.Context, _ *idrangev1.StatusRequest) (*idrangev1.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	snap, err := s.cfg.Store.Snapshot(ctx, s.cfg.Region)
	if err != nil {
		return nil, toStatus(err)
	}
	now := s.cfg.Now()
	resp := &idrangev1.StatusResponse{
		Region:           uint32(s.cfg.Region),
		Serving:          s.cfg.Serving(),
		NowUnixMs:        now.UnixMilli(),
		FreeCodes:        uint32(snap.Free),
		HeldCodes:        uint32(len(snap.Leases)),
		CorruptCodes:     uint32(len(snap.Corrupt)),
		MaxHwmLeadWorker: -1,
		EpochLifeLeftMs:  snowflake.RemainingLife(now).Milliseconds(),
		EpochEndUnixMs:   snowflake.EndOfLife().UnixMilli(),
		EtcdEndpoints:    s.cfg.Etcd.Endpoints(),
		StoreRevision:    snap.Rev,
	}
	for w := range snowflake.MaxWorker + 1 {
		hwm, ok := snap.HighWaters[w]
		if !ok {
			continue
		}
		lead := hwmTime(hwm).Sub(now).Milliseconds()
		if resp.MaxHwmLeadWorker < 0 || lead > resp.MaxHwmLeadMs {
			resp.MaxHwmLeadMs, resp.MaxHwmLeadWorker = lead, int32(w)
		}
	}
	resp.EtcdMembers = s.members(ctx)
	alarms, err := s.alarms(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	resp.Alarms = alarms
	if s.cfg.RegionRecord != nil {
		st, recErr, refusal := s.cfg.RegionRecord(ctx)
		if st.ModRevision != 0 {
			resp.RegionRecord = recordProto(st.Record)
		}
		if recErr != nil {
			resp.RegionRecordError = recErr.Error()
		}
		resp.RegionCheck = "ok"
		if refusal != nil {
			resp.RegionCheck = refusal.Error()
		}
	}
	return resp, nil
}

// recordProto is the region record on the wire.
func recordProto(r regionid.Record) *idrangev1.RegionRecord {
	return &idrangev1.RegionRecord{
		Version: uint32(r.Version), Region: uint32(r.Region), RegionId: r.RegionID, CreatedUnixMs: r.CreatedUnixMs,
		Layout: uint32(r.Layout), EtcdClusterId: r.EtcdClusterID,
		RegistryClaimedUnixMs: r.RegistryClaimedUnixMs, RegistryClusterId: r.RegistryClusterID,
		RestorePending: r.RestorePending, RestoreReason: r.RestoreReason, RestoreSinceUnixMs: r.RestoreSinceUnixMs,
		FencedUnixMs: r.FencedUnixMs, FencedToUnixMs: r.FencedToUnixMs,
	}
}

// maxRestoreMargin bounds RestoreFenceRequest.margin_ms: a lift far into
// the future stops every code for as long (each grant waits until the clock
// is within the max lead of the lifted mark).
const maxRestoreMargin = 10 * time.Minute

// RestoreFence lifts every high-water mark of the region after an etcd
// restore (regionid.Fence) and clears the region's pending restore.
func (s *Server) RestoreFence(ctx context.Context, req *idrangev1.RestoreFenceRequest) (*idrangev1.RestoreFenceResponse, error) {
	if s.cfg.RestoreFence == nil {
		return nil, status.Error(codes.Unimplemented, "restore fence is not available on this replica")
	}
	margin := time.Duration(req.GetMarginMs()) * time.Millisecond
	if margin < 0 || margin > maxRestoreMargin {
		return nil, status.Errorf(codes.InvalidArgument, "margin_ms %d not in 0..%d", req.GetMarginMs(), maxRestoreMargin.Milliseconds())
	}
	if err := checkReason(req.GetReason()); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	res, err := s.cfg.RestoreFence(ctx, margin)
	if err != nil {
		s.audit(ctx, "restore-fence", req.GetReason(), err, "margin", margin)
		if errors.Is(err, regionid.ErrCorrupt) || errors.Is(err, regionid.ErrMismatch) {
			return nil, status.Error(codes.FailedPrecondition, err.Error())
		}
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	s.audit(ctx, "restore-fence", req.GetReason(), nil, "margin", margin,
		"fenced_to_unix_ms", res.Stored.Record.FencedToUnixMs, "codes_lifted", res.Lifted, "txns", res.Txns)
	return &idrangev1.RestoreFenceResponse{Record: recordProto(res.Stored.Record), CodesLifted: uint32(res.Lifted),
		Transactions: uint32(res.Txns)}, nil
}

// members asks every endpoint for its Maintenance Status; an endpoint that
// does not answer gets a row with its error.
func (s *Server) members(ctx context.Context) []*idrangev1.EtcdMember {
	eps := s.cfg.Etcd.Endpoints()
	out := make([]*idrangev1.EtcdMember, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() {
			m := &idrangev1.EtcdMember{Endpoint: ep}
			out[i] = m
			mctx, cancel := context.WithTimeout(ctx, memberTimeout)
			r, err := s.cfg.Etcd.Status(mctx, ep)
			cancel()
			if err != nil {
				m.Error = err.Error()
				return
			}
			st := (*etcdserverpb.StatusResponse)(r)
			if h := st.GetHeader(); h != nil {
				m.MemberId = h.GetMemberId()
			}
			m.LeaderId = st.GetLeader()
			m.DbSizeBytes = st.GetDbSize()
			m.DbSizeInUseBytes = st.GetDbSizeInUse()
			m.DbQuotaBytes = st.GetDbSizeQuota()
			m.Version = st.GetVersion()
			m.Errors = st.GetErrors()
		})
	}
	wg.Wait()
	return out
}

// alarms lists the cluster's active alarms.
func (s *Server) alarms(ctx context.Context) ([]*idrangev1.Alarm, error) {
	resp, err := s.cfg.Etcd.AlarmList(ctx)
	if err != nil {
		return nil, etcdErr(err, "list etcd alarms")
	}
	return alarmsFrom(resp.Alarms), nil
}

func alarmsFrom(ms []*etcdserverpb.AlarmMember) []*idrangev1.Alarm {
	out := make([]*idrangev1.Alarm, 0, len(ms))
	for _, m := range ms {
		out = append(out, &idrangev1.Alarm{MemberId: m.GetMemberID(), Type: m.GetAlarm().String()})
	}
	return out
}

// ListLeases lists the held codes with their etcd TTLs and high-water marks.
func (s *Server) ListLeases(ctx context.Context, _ *idrangev1.ListLeasesRequest) (*idrangev1.ListLeasesResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	snap, err := s.cfg.Store.Snapshot(ctx, s.cfg.Region)
	if err != nil {
		return nil, toStatus(err)
	}
	now := s.cfg.Now()
	resp := &idrangev1.ListLeasesResponse{
		Region: uint32(s.cfg.Region), NowUnixMs: now.UnixMilli(), StoreRevision: snap.Rev,
		Leases: make([]*idrangev1.LeaseRow, len(snap.Leases)),
	}
	sem := make(chan struct{}, ttlParallel)
	var wg sync.WaitGroup
	for i, li := range snap.Leases {
		row := leaseRow(li)
		if hwm, ok := snap.HighWaters[li.Worker]; ok {
			row.Hwm = hwm
			row.HwmUnixMs = hwmTime(hwm).UnixMilli()
			row.HwmLeadMs = hwmTime(hwm).Sub(now).Milliseconds()
		}
		if err := snap.Corrupt[li.Worker]; err != nil {
			row.Error = joinMsg(row.Error, err.Error())
		}
		resp.Leases[i] = row
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			row.TtlLeftMs = s.ttlLeft(ctx, li.LeaseID)
		})
	}
	wg.Wait()
	return resp, nil
}

// ttlLeft is etcd's remaining TTL of lease id, TTLGone or TTLUnknown.
func (s *Server) ttlLeft(ctx context.Context, id int64) int64 {
	if id <= 0 {
		return TTLGone
	}
	r, err := s.cfg.Etcd.TimeToLive(ctx, clientv3.LeaseID(id))
	switch {
	case err != nil:
		return TTLUnknown
	case r.TTL < 0:
		return TTLGone
	}
	return r.TTL * 1000 // etcd reports whole seconds
}

func leaseRow(li store.LeaseInfo) *idrangev1.LeaseRow {
	row := &idrangev1.LeaseRow{
		Worker: uint32(li.Worker), Owner: li.Owner, Identity: li.Identity, Token: li.Token, LeaseId: li.LeaseID,
	}
	if !li.Acquired.IsZero() {
		row.AcquiredUnixMs = li.Acquired.UnixMilli()
	}
	if li.Err != nil {
		row.Error = li.Err.Error()
	}
	return row
}

func joinMsg(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// Fence ends one code's current lease (store.Store.Fence).
func (s *Server) Fence(ctx context.Context, req *idrangev1.FenceRequest) (*idrangev1.FenceResponse, error) {
	if w := req.GetWorker(); w > snowflake.MaxWorker {
		return nil, status.Errorf(codes.InvalidArgument, "worker: %d not in 0..%d", w, snowflake.MaxWorker)
	}
	if t := req.GetToken(); t < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "token: %d is negative (0: the current owner)", t)
	}
	if err := checkReason(req.GetReason()); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	li, err := s.cfg.Store.Fence(ctx, s.cfg.Region, int(req.GetWorker()), req.GetToken())
	if err != nil {
		s.audit(ctx, "fence", req.GetReason(), err, "worker", req.GetWorker(), "token", req.GetToken())
		if errors.Is(err, segment.ErrLeaseLost) {
			return nil, status.Error(codes.NotFound, err.Error())
		}
		return nil, toStatus(err)
	}
	s.audit(ctx, "fence", req.GetReason(), nil, "worker", li.Worker, "token", li.Token,
		"lease_id", fmt.Sprintf("%x", li.LeaseID), "owner", li.Owner, "owner_identity", li.Identity)
	return &idrangev1.FenceResponse{Fenced: leaseRow(li)}, nil
}

// maxReasonLen bounds an admin request's reason: one audit log line.
const maxReasonLen = 256

// checkReason is the rule for an admin request's reason: printable UTF-8
// of at most maxReasonLen bytes ("" is allowed). Errors are InvalidArgument.
func checkReason(r string) error {
	switch {
	case len(r) > maxReasonLen:
		return status.Errorf(codes.InvalidArgument, "reason: %d bytes, more than %d", len(r), maxReasonLen)
	case !utf8.ValidString(r):
		return status.Error(codes.InvalidArgument, "reason: not valid UTF-8")
	}
	for _, c := range r {
		if !unicode.IsPrint(c) {
			return status.Errorf(codes.InvalidArgument, "reason: contains the non-printable character %U", c)
		}
	}
	return nil
}

// audit logs one admin action as an audit line (audit=true): the action,
// the caller's verified identity (mutual TLS; "" without it) and address,
// the operator's reason, the outcome, and what the action touched. Refused
// and failed attempts are logged too.
func (s *Server) audit(ctx context.Context, action, reason string, err error, attrs ...any) {
	outcome := "ok"
	if err != nil {
		outcome = "failed"
		attrs = append(attrs, "err", err)
	}
	attrs = append([]any{"audit", true, "action", action, "outcome", outcome,
		"identity", authz.IdentityFrom(ctx), "peer", peerAddr(ctx), "reason", reason}, attrs...)
	s.log.Warn("admin "+action, attrs...)
}

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// ListAlarms lists the cluster's active etcd alarms.
func (s *Server) ListAlarms(ctx context.Context, _ *idrangev1.ListAlarmsRequest) (*idrangev1.ListAlarmsResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	alarms, err := s.alarms(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return &idrangev1.ListAlarmsResponse{Alarms: alarms}, nil
}

// DisarmAlarm clears NOSPACE alarms (of one member, or all). Disarming
// CORRUPT is refused: it means a member's data diverged, which needs that
// member replaced, not an alarm cleared.
func (s *Server) DisarmAlarm(ctx context.Context, req *idrangev1.DisarmAlarmRequest) (*idrangev1.DisarmAlarmResponse, error) {
	want := etcdserverpb.AlarmType_NOSPACE
	if req.GetType() != want.String() {
		return nil, status.Errorf(codes.InvalidArgument, "type: %q; only %s may be disarmed", req.GetType(), want)
	}
	if err := checkReason(req.GetReason()); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	list, err := s.cfg.Etcd.AlarmList(ctx)
	if err != nil {
		return nil, toStatus(etcdErr(err, "list etcd alarms"))
	}
	resp := &idrangev1.DisarmAlarmResponse{}
	for _, m := range list.Alarms {
		if m.GetAlarm() != want || (req.GetMemberId() != 0 && m.GetMemberID() != req.GetMemberId()) {
			continue
		}
		member := fmt.Sprintf("%x", m.GetMemberID())
		if _, err := s.cfg.Etcd.AlarmDisarm(ctx, (*clientv3.AlarmMember)(m)); err != nil {
			err = etcdErr(err, fmt.Sprintf("disarm %s on member %x", want, m.GetMemberID()))
			s.audit(ctx, "alarm disarm", req.GetReason(), err, "alarm", want.String(), "member_id", member)
			return nil, toStatus(err)
		}
		s.audit(ctx, "alarm disarm", req.GetReason(), nil, "alarm", want.String(), "member_id", member)
		resp.Disarmed = append(resp.Disarmed, &idrangev1.Alarm{MemberId: m.GetMemberID(), Type: want.String()})
	}
	if len(resp.Disarmed) == 0 {
		if req.GetMemberId() != 0 {
			return nil, status.Errorf(codes.NotFound, "no %s alarm on member %x", want, req.GetMemberId())
		}
		return nil, status.Errorf(codes.NotFound, "no %s alarm is active", want)
	}
	if resp.Alarms, err = s.alarms(ctx); err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}
