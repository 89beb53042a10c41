package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/errors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/server/admin"
	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/snowflake"
)

// `rangesvc admin` talks to the AdminService of the replicas (see
// internal/server/admin for why through the service and not to etcd directly).

const adminUsage = `usage: rangesvc admin <command> --target ADDR[,ADDR...] [-o table|json] [flags]

commands:
  status                 the region (free and held codes, largest HWM lead,
                         epoch life, etcd members and alarms) and the health,
                         codes held and shared-path clients of every --target
                         replica
  leases                 one row per held worker code
  fence --worker N       end code N's lease; its owner stops at its next renewal
        [--token T]      or grant (T: only if token T still owns the code)
  alarm [list]           active etcd alarms
  alarm disarm           clear NOSPACE (after compaction and defragmentation)
        [--member ID]    (hex member ID; default every member)
  restore-fence          after an etcd restore: lift every code's high-water mark
        [--margin D]     past what the lost writes could have granted, then let
                         the region grant again (docs/operations.md)

fence, alarm disarm and restore-fence take --reason TEXT: the replica writes it,
with the caller's identity, into its audit log line for the action.
`

// adminConfig is `rangesvc admin`'s flags. Transport security flags join it
// with mTLS; dialAdmin is the one place they are used.
type adminConfig struct {
	Command string         // status, leases, fence, alarm list, alarm disarm
	Targets []string       // --target ADDR[,ADDR...] (required)
	Output  string         // -o table|json (default table)
	Timeout time.Duration  // --timeout for the whole command (default 10s)
	Worker  int            // fence --worker (required, 0..255)
	Token   int64          // fence --token (0: the current owner, looked up first)
	Member  uint64         // alarm disarm --member (0: every member)
	Margin  time.Duration  // restore-fence --margin (0: the replica's default)
	Reason  string         // fence, restore-fence, alarm disarm --reason (the replica's audit log)
	TLS     clientTLSFlags // --tls-cert, --tls-key, --tls-ca, --tls-server-name

	tls *tls.Config // loaded from TLS; nil: plaintext
}

func parseAdminFlags(args []string, stderr io.Writer) (adminConfig, error) {
	c := adminConfig{Worker: -1}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fmt.Fprint(stderr, adminUsage)
			return c, cli.ErrHelp
		}
		fmt.Fprint(stderr, adminUsage)
		return c, cli.Usagef("missing command: status, leases, fence or alarm")
	}
	c.Command, args = args[0], args[1:]
	switch c.Command {
	case "status", "leases", "fence", "restore-fence":
	case "alarm":
		c.Command = "alarm list"
		if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			switch args[0] {
			case "list", "disarm":
				c.Command = "alarm " + args[0]
			default:
				return c, cli.Usagef("alarm %q: want list or disarm", args[0])
			}
			args = args[1:]
		}
	default:
		fmt.Fprint(stderr, adminUsage)
		return c, cli.Usagef("unknown command %q: want status, leases, fence, alarm or restore-fence", c.Command)
	}
	fs := cli.NewFlagSet(prog, "admin "+c.Command, stderr)
	targetFlag(fs, &c.Targets)
	fs.StringVar(&c.Output, "o", "table", "output: table or json")
	fs.DurationVar(&c.Timeout, "timeout", 10*time.Second, "give up after this long")
	c.TLS.register(fs)
	switch c.Command {
	case "fence", "restore-fence", "alarm disarm":
		fs.StringVar(&c.Reason, "reason", "", "why, for the replica's audit log (printable, at most 256 bytes)")
	}
	switch c.Command {
	case "fence":
		fs.IntVar(&c.Worker, "worker", -1, "worker code to fence, 0..255 (required)")
		fs.Int64Var(&c.Token, "token", 0, "fence only if this token still owns the code (0: whichever owner holds it now)")
	case "restore-fence":
		fs.DurationVar(&c.Margin, "margin", 0, "added to max lead + max block span (0: the replica's default, 5s)")
	case "alarm disarm":
		fs.Func("member", "hex etcd member ID whose NOSPACE alarm to clear (default: every member)", func(s string) error {
			v, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 64)
			if err != nil || v == 0 {
				return errors.Newf("%q is not a non-zero hex member ID", s)
			}
			c.Member = v
			return nil
		})
	}
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), adminUsage+"\nflags of admin "+c.Command+":\n")
		fs.PrintDefaults()
	}
	if err := cli.ParseFlags(fs, args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, cli.Usagef("unexpected arguments %q", fs.Args())
	}
	if err := checkTargets(c.Targets); err != nil {
		return c, err
	}
	switch {
	case c.Output != "table" && c.Output != "json":
		return c, cli.Usagef("-o %q: want table or json", c.Output)
	case c.Timeout <= 0:
		return c, cli.Usagef("--timeout %v must be positive", c.Timeout)
	case c.Command == "fence" && (c.Worker < 0 || c.Worker > snowflake.MaxWorker):
		if !flagSet(fs, "worker") {
			return c, cli.Usagef("--worker is required")
		}
		return c, cli.Usagef("--worker %d not in 0..%d", c.Worker, snowflake.MaxWorker)
	case c.Token < 0:
		return c, cli.Usagef("--token %d is negative", c.Token)
	case c.Margin < 0 || c.Margin > 10*time.Minute:
		return c, cli.Usagef("--margin %v not in 0..10m", c.Margin)
	}
	var err error
	c.tls, err = c.TLS.config()
	return c, err
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// runAdmin runs one admin command against the --target replicas.
func runAdmin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseAdminFlags(args, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	conns := make([]*grpc.ClientConn, len(c.Targets))
	for i, t := range c.Targets {
		if conns[i], err = dialAdmin(c, t); err != nil {
			return errors.Wrapf(err, "dial %s", t)
		}
		defer conns[i].Close()
	}
	a := &adminRun{cfg: c, conns: conns, out: stdout}
	switch c.Command {
	case "status":
		return a.status(ctx)
	case "leases":
		return a.leases(ctx)
	case "fence":
		return a.fence(ctx)
	case "alarm list":
		return a.alarmList(ctx)
	case "alarm disarm":
		return a.alarmDisarm(ctx)
	case "restore-fence":
		return a.restoreFence(ctx)
	}
	return cli.Usagef("unknown command %q", c.Command)
}

// dialAdmin opens a connection to one replica: the one place the admin
// commands choose transport credentials.
func dialAdmin(c adminConfig, target string) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if c.tls != nil {
		creds = credentials.NewTLS(c.tls)
	}
	return grpc.NewClient(target, grpc.WithTransportCredentials(creds))
}

type adminRun struct {
	cfg   adminConfig
	conns []*grpc.ClientConn
	out   io.Writer
}

// first calls f on the targets in order until one answers, moving on only
// when a replica is unreachable (Unavailable, or its deadline passed), and
// returns the target that answered.
func (a *adminRun) first(ctx context.Context, f func(idrangev1.AdminServiceClient) error) (string, error) {
	var errs []string
	for i, cc := range a.conns {
		err := f(idrangev1.NewAdminServiceClient(cc))
		if err == nil {
			return a.cfg.Targets[i], nil
		}
		if c := status.Code(err); (c != codes.Unavailable && c != codes.DeadlineExceeded) || ctx.Err() != nil {
			return "", errors.Newf("%s: %s", a.cfg.Targets[i], rpcMessage(err))
		}
		errs = append(errs, fmt.Sprintf("%s: %s", a.cfg.Targets[i], rpcMessage(err)))
	}
	return "", errors.Newf("no replica answered: %s", strings.Join(errs, "; "))
}

// rpcMessage is a gRPC error as "Code: message", on one line.
func rpcMessage(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return err.Error()
	}
	return st.Code().String() + ": " + strings.Join(strings.Fields(st.Message()), " ")
}

func (a *adminRun) json(v any) error {
	enc := json.NewEncoder(a.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (a *adminRun) table() *tabwriter.Writer {
	return tabwriter.NewWriter(a.out, 0, 0, 2, ' ', 0)
}

// JSON shapes of the admin commands' output (-o json). Times are RFC 3339
// UTC; durations are milliseconds; etcd member IDs are hex, as etcdctl
// prints them.

type replicaJSON struct {
	Target string `json:"target"`
	Health string `json:"health"`           // SERVING, NOT_SERVING, ... or UNREACHABLE
	Region *int   `json:"region,omitempty"` // from GetReplicaInfo
	// From GetReplicaInfo too: the worker codes the replica's own minter
	// holds (MintBatch, Next, HTTP and the shared path carve from it) and
	// the distinct shared-path clients it granted a run in the last minute.
	// Absent when GetReplicaInfo did not answer.
	CodesHeld     *int `json:"codes_held,omitempty"`
	SharedClients *int `json:"shared_clients,omitempty"`
	// SharedPath: the replica serves the shared path (AllocateShared).
	SharedPath *bool  `json:"shared_path,omitempty"`
	Error      string `json:"error,omitempty"`
}

type memberJSON struct {
	Endpoint    string   `json:"endpoint"`
	MemberID    string   `json:"member_id,omitempty"`
	LeaderID    string   `json:"leader_id,omitempty"`
	DBSize      int64    `json:"db_size_bytes"`
	DBSizeInUse int64    `json:"db_size_in_use_bytes"`
	DBQuota     int64    `json:"db_quota_bytes"`
	Version     string   `json:"version,omitempty"`
	Error       string   `json:"error,omitempty"`
	Errors      []string `json:"errors,omitempty"`
}

type alarmJSON struct {
	MemberID string `json:"member_id"`
	Type     string `json:"type"`
}

type statusJSON struct {
	Replicas         []replicaJSON `json:"replicas"`
	AnsweredBy       string        `json:"answered_by"`
	Region           int           `json:"region"`
	Serving          bool          `json:"serving"` // the answering replica
	Now              time.Time     `json:"now"`
	FreeCodes        int           `json:"free_codes"`
	HeldCodes        int           `json:"held_codes"`
	CorruptCodes     int           `json:"corrupt_codes"`
	MaxHWMLeadMs     int64         `json:"max_hwm_lead_ms"`
	MaxHWMLeadWorker int           `json:"max_hwm_lead_worker"` // -1: no code has a HWM
	EpochLifeLeftMs  int64         `json:"epoch_life_left_ms"`
	EpochEnd         time.Time     `json:"epoch_end"`
	StoreRevision    int64         `json:"store_revision"`
	EtcdEndpoints    []string      `json:"etcd_endpoints"`
	EtcdMembers      []memberJSON  `json:"etcd_members"`
	Alarms           []alarmJSON   `json:"alarms"`
	// The region record (absent when it could not be read), why it could
	// not be, and the answering replica's region check ("ok" or why it
	// refuses to grant).
	RegionRecord      *regionRecordJSON `json:"region_record,omitempty"`
	RegionRecordError string            `json:"region_record_error,omitempty"`
	RegionCheck       string            `json:"region_check,omitempty"`
}

type leaseJSON struct {
	Worker    int        `json:"worker"`
	Owner     string     `json:"owner"`
	Identity  string     `json:"identity,omitempty"` // the verified client identity (mTLS)
	Token     int64      `json:"token"`
	LeaseID   string     `json:"lease_id"` // hex, as etcdctl prints it
	TTLLeftMs int64      `json:"ttl_left_ms"`
	Acquired  *time.Time `json:"acquired,omitempty"`
	HWM       int64      `json:"hwm"` // linear space ms<<12|seq, exclusive end; 0: no grant yet
	HWMTime   *time.Time `json:"hwm_time,omitempty"`
	HWMLeadMs int64      `json:"hwm_lead_ms"`
	Error     string     `json:"error,omitempty"`
}

type leasesJSON struct {
	Region        int         `json:"region"`
	Now           time.Time   `json:"now"`
	StoreRevision int64       `json:"store_revision"`
	Leases        []leaseJSON `json:"leases"`
}

func unixMs(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

func hex(v uint64) string {
	if v == 0 {
		return ""
	}
	return strconv.FormatUint(v, 16)
}

func alarmsJSON(as []*idrangev1.Alarm) []alarmJSON {
	out := make([]alarmJSON, 0, len(as))
	for _, al := range as {
		out = append(out, alarmJSON{MemberID: hex(al.GetMemberId()), Type: al.GetType()})
	}
	return out
}

func leaseFromRow(r *idrangev1.LeaseRow) leaseJSON {
	l := leaseJSON{
		Worker: int(r.GetWorker()), Owner: r.GetOwner(), Identity: r.GetIdentity(), Token: r.GetToken(),
		LeaseID: hex(uint64(r.GetLeaseId())), TTLLeftMs: r.GetTtlLeftMs(),
		HWM: r.GetHwm(), HWMLeadMs: r.GetHwmLeadMs(), Error: r.GetError(),
	}
	if ms := r.GetAcquiredUnixMs(); ms != 0 {
		t := unixMs(ms)
		l.Acquired = &t
	}
	if r.GetHwm() != 0 {
		t := unixMs(r.GetHwmUnixMs())
		l.HWMTime = &t
	}
	return l
}

// replicas asks every target for its health and region, concurrently.
func (a *adminRun) replicas(ctx context.Context) []replicaJSON {
	out := make([]replicaJSON, len(a.conns))
	var wg sync.WaitGroup
	for i, cc := range a.conns {
		wg.Go(func() {
			r := replicaJSON{Target: a.cfg.Targets[i]}
			h, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				r.Health, r.Error = "UNREACHABLE", rpcMessage(err)
				out[i] = r
				return
			}
			r.Health = h.GetStatus().String()
			info, err := idrangev1.NewRangeServiceClient(cc).GetReplicaInfo(ctx, &idrangev1.GetReplicaInfoRequest{})
			if err != nil {
				r.Error = rpcMessage(err)
			} else {
				reg, held, shared, on := int(info.GetRegion()), int(info.GetCodesHeld()), int(info.GetSharedClients()), info.GetSharedPath()
				r.Region, r.CodesHeld, r.SharedClients, r.SharedPath = &reg, &held, &shared, &on
			}
			out[i] = r
		})
	}
	wg.Wait()
	return out
}

func (a *adminRun) status(ctx context.Context) error {
	reps := a.replicas(ctx)
	var st *idrangev1.StatusResponse
	by, err := a.first(ctx, func(c idrangev1.AdminServiceClient) (err error) {
		st, err = c.Status(ctx, &idrangev1.StatusRequest{})
		return err
	})
	if err != nil {
		// No region view (etcd down, say): the replicas' health is still
		// worth printing, then the command fails.
		if perr := a.printReplicas(reps, err); perr != nil {
			return perr
		}
		return err
	}
	out := statusJSON{
		Replicas: reps, AnsweredBy: by, Region: int(st.GetRegion()), Serving: st.GetServing(),
		Now: unixMs(st.GetNowUnixMs()), FreeCodes: int(st.GetFreeCodes()), HeldCodes: int(st.GetHeldCodes()),
		CorruptCodes: int(st.GetCorruptCodes()), MaxHWMLeadMs: st.GetMaxHwmLeadMs(),
		MaxHWMLeadWorker: int(st.GetMaxHwmLeadWorker()), EpochLifeLeftMs: st.GetEpochLifeLeftMs(),
		EpochEnd: unixMs(st.GetEpochEndUnixMs()), StoreRevision: st.GetStoreRevision(),
		EtcdEndpoints: st.GetEtcdEndpoints(), Alarms: alarmsJSON(st.GetAlarms()),
		RegionRecord: recordJSON(st.GetRegionRecord()), RegionRecordError: st.GetRegionRecordError(),
		RegionCheck: st.GetRegionCheck(),
	}
	for _, m := range st.GetEtcdMembers() {
		out.EtcdMembers = append(out.EtcdMembers, memberJSON{
			Endpoint: m.GetEndpoint(), MemberID: hex(m.GetMemberId()), LeaderID: hex(m.GetLeaderId()),
			DBSize: m.GetDbSizeBytes(), DBSizeInUse: m.GetDbSizeInUseBytes(), DBQuota: m.GetDbQuotaBytes(),
			Version: m.GetVersion(), Error: m.GetError(), Errors: m.GetErrors(),
		})
	}
	if a.cfg.Output == "json" {
		return a.json(out)
	}
	w := a.table()
	replicaRows(w, out.Replicas)
	fmt.Fprintln(w)
	serving := "SERVING"
	if !out.Serving {
		serving = "NOT_SERVING"
	}
	lead := "none (no code has a grant)"
	if out.MaxHWMLeadWorker >= 0 {
		lead = fmt.Sprintf("%v (worker %d)", msDur(out.MaxHWMLeadMs), out.MaxHWMLeadWorker)
	}
	alarms := "none"
	if len(out.Alarms) > 0 {
		var s []string
		for _, al := range out.Alarms {
			s = append(s, al.Type+" on member "+al.MemberID)
		}
		alarms = strings.Join(s, ", ")
	}
	for _, kv := range [][2]string{
		{"region", strconv.Itoa(out.Region)},
		{"answered by", fmt.Sprintf("%s (%s)", out.AnsweredBy, serving)},
		{"free codes", strconv.Itoa(out.FreeCodes)},
		{"held codes", strconv.Itoa(out.HeldCodes)},
		{"corrupt codes", strconv.Itoa(out.CorruptCodes)},
		{"max HWM lead", lead},
		{"epoch life left", fmt.Sprintf("%s (ends %s)", days(out.EpochLifeLeftMs), out.EpochEnd.Format(time.RFC3339Nano))},
		{"store revision", strconv.FormatInt(out.StoreRevision, 10)},
		{"etcd endpoints", strings.Join(out.EtcdEndpoints, ",")},
		{"alarms", alarms},
	} {
		fmt.Fprintf(w, "%s\t%s\n", kv[0], kv[1])
	}
	for _, kv := range out.regionRows() {
		fmt.Fprintf(w, "%s\t%s\n", kv[0], kv[1])
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "ETCD ENDPOINT\tMEMBER\tLEADER\tDB SIZE\tIN USE\tQUOTA\tVERSION\tERROR")
	for _, m := range out.EtcdMembers {
		errs := m.Error
		if len(m.Errors) > 0 {
			errs = joinNonEmpty(errs, strings.Join(m.Errors, "; "))
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Endpoint, m.MemberID, m.LeaderID,
			bytesStr(m.DBSize), bytesStr(m.DBSizeInUse), bytesStr(m.DBQuota), m.Version, errs)
	}
	return w.Flush()
}

func replicaRows(w io.Writer, reps []replicaJSON) {
	fmt.Fprintln(w, "REPLICA\tREGION\tHEALTH\tCODES HELD\tSHARED PATH\tSHARED CLIENTS\tERROR")
	for _, r := range reps {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Target, intOrDash(r.Region), r.Health,
			intOrDash(r.CodesHeld), onOff(r.SharedPath), intOrDash(r.SharedClients), r.Error)
	}
}

// onOff prints an optional switch ("-": not reported).
func onOff(v *bool) string {
	switch {
	case v == nil:
		return "-"
	case *v:
		return "on"
	}
	return "off"
}

// intOrDash prints an optional count ("-": not reported).
func intOrDash(v *int) string {
	if v == nil {
		return "-"
	}
	return strconv.Itoa(*v)
}

// printReplicas prints only the replicas' health, for a status whose
// region view failed with err.
func (a *adminRun) printReplicas(reps []replicaJSON, err error) error {
	if a.cfg.Output == "json" {
		return a.json(struct {
			Replicas []replicaJSON `json:"replicas"`
			Error    string        `json:"error"`
		}{reps, err.Error()})
	}
	w := a.table()
	replicaRows(w, reps)
	return w.Flush()
}

func joinNonEmpty(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func msDur(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

// days prints a long duration as days and hours.
func days(ms int64) string {
	d := msDur(ms)
	return fmt.Sprintf("%dd%dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
}

// bytesStr prints a byte count in binary units ("-" for 0: not reported).
func bytesStr(n int64) string {
	if n == 0 {
		return "-"
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	v, i := float64(n), 0
	for ; v >= 1024 && i < len(units)-1; i++ {
		v /= 1024
	}
	if i == 0 {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}

func (a *adminRun) leaseRows(ctx context.Context) (*idrangev1.ListLeasesResponse, error) {
	var resp *idrangev1.ListLeasesResponse
	_, err := a.first(ctx, func(c idrangev1.AdminServiceClient) (err error) {
		resp, err = c.ListLeases(ctx, &idrangev1.ListLeasesRequest{})
		return err
	})
	return resp, err
}

func (a *adminRun) leases(ctx context.Context) error {
	resp, err := a.leaseRows(ctx)
	if err != nil {
		return err
	}
	out := leasesJSON{Region: int(resp.GetRegion()), Now: unixMs(resp.GetNowUnixMs()),
		StoreRevision: resp.GetStoreRevision(), Leases: []leaseJSON{}}
	for _, r := range resp.GetLeases() {
		out.Leases = append(out.Leases, leaseFromRow(r))
	}
	if a.cfg.Output == "json" {
		return a.json(out)
	}
	w := a.table()
	fmt.Fprintln(w, "WORKER\tOWNER\tIDENTITY\tTOKEN\tLEASE\tTTL LEFT\tHWM TIME\tHWM LEAD\tACQUIRED\tERROR")
	for _, l := range out.Leases {
		fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", l.Worker, orDash(l.Owner), orDash(l.Identity), l.Token, l.LeaseID,
			ttlStr(l.TTLLeftMs), timeStr(l.HWMTime), leadStr(l), timeStr(l.Acquired), l.Error)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(a.out, "\n%d held codes in region %d at revision %d\n", len(out.Leases), out.Region, out.StoreRevision)
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func ttlStr(ms int64) string {
	switch ms {
	case admin.TTLGone:
		return "gone"
	case admin.TTLUnknown:
		return "?"
	}
	return msDur(ms).String()
}

func timeStr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format("2006-01-02T15:04:05.000Z")
}

func leadStr(l leaseJSON) string {
	if l.HWM == 0 {
		return "-"
	}
	return msDur(l.HWMLeadMs).String()
}

// fence ends one code's lease. Without --token it first looks up the
// code's current token and fences by it, so that a retry on another
// replica (after a reply was lost) can never fence a newer owner.
func (a *adminRun) fence(ctx context.Context) error {
	token := a.cfg.Token
	if token == 0 {
		resp, err := a.leaseRows(ctx)
		if err != nil {
			return err
		}
		for _, r := range resp.GetLeases() {
			if int(r.GetWorker()) == a.cfg.Worker {
				token = r.GetToken()
			}
		}
		if token == 0 {
			return errors.Newf("worker %d of region %d is not held: nothing to fence", a.cfg.Worker, resp.GetRegion())
		}
	}
	var resp *idrangev1.FenceResponse
	by, err := a.first(ctx, func(c idrangev1.AdminServiceClient) (err error) {
		resp, err = c.Fence(ctx, &idrangev1.FenceRequest{Worker: uint32(a.cfg.Worker), Token: token, Reason: a.cfg.Reason})
		return err
	})
	if err != nil {
		return err
	}
	l := leaseFromRow(resp.GetFenced())
	if a.cfg.Output == "json" {
		return a.json(struct {
			AnsweredBy string    `json:"answered_by"`
			Fenced     leaseJSON `json:"fenced"`
		}{by, l})
	}
	w := a.table()
	fmt.Fprintln(w, "FENCED WORKER\tOWNER\tTOKEN\tLEASE\tACQUIRED")
	fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%s\n", l.Worker, orDash(l.Owner), l.Token, l.LeaseID, timeStr(l.Acquired))
	return w.Flush()
}

func (a *adminRun) alarmList(ctx context.Context) error {
	var resp *idrangev1.ListAlarmsResponse
	if _, err := a.first(ctx, func(c idrangev1.AdminServiceClient) (err error) {
		resp, err = c.ListAlarms(ctx, &idrangev1.ListAlarmsRequest{})
		return err
	}); err != nil {
		return err
	}
	return a.printAlarms("ALARM", alarmsJSON(resp.GetAlarms()), func() error {
		return a.json(struct {
			Alarms []alarmJSON `json:"alarms"`
		}{alarmsJSON(resp.GetAlarms())})
	})
}

func (a *adminRun) alarmDisarm(ctx context.Context) error {
	var resp *idrangev1.DisarmAlarmResponse
	if _, err := a.first(ctx, func(c idrangev1.AdminServiceClient) (err error) {
		resp, err = c.DisarmAlarm(ctx, &idrangev1.DisarmAlarmRequest{Type: "NOSPACE", MemberId: a.cfg.Member, Reason: a.cfg.Reason})
		return err
	}); err != nil {
		return err
	}
	return a.printAlarms("DISARMED", alarmsJSON(resp.GetDisarmed()), func() error {
		return a.json(struct {
			Disarmed []alarmJSON `json:"disarmed"`
			Alarms   []alarmJSON `json:"alarms"`
		}{alarmsJSON(resp.GetDisarmed()), alarmsJSON(resp.GetAlarms())})
	})
}

func (a *adminRun) printAlarms(head string, as []alarmJSON, asJSON func() error) error {
	if a.cfg.Output == "json" {
		return asJSON()
	}
	w := a.table()
	fmt.Fprintf(w, "%s\tMEMBER\n", head)
	for _, al := range as {
		fmt.Fprintf(w, "%s\t%s\n", al.Type, al.MemberID)
	}
	return w.Flush()
}
