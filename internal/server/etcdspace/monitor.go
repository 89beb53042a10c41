package etcdspace

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Defaults of MonitorConfig.
const (
	// DefaultQuotaBytes is etcd's own default backend quota (2 GiB), what
	// a cluster started without --quota-backend-bytes runs with.
	DefaultQuotaBytes int64 = 2 << 30
	// DefaultMonitorInterval is how often the backend size and the alarms
	// are read. Reading the alarms is a raft request, so not every health
	// check does it.
	DefaultMonitorInterval = 5 * time.Second
)

// ErrNoSpace: etcd raised its NOSPACE alarm (a member's backend reached the
// quota) and refuses writes, so no grant can commit. Monitor.Err wraps it.
var ErrNoSpace = errors.New("etcd alarm NOSPACE")

// MonitorConfig configures a Monitor. Etcd is required.
type MonitorConfig struct {
	// Etcd is the client (required); every endpoint it has is asked for its
	// status.
	Etcd *clientv3.Client
	// Interval is how often Run reads the members' status and the alarms.
	// Default DefaultMonitorInterval.
	Interval time.Duration
	// QuotaBytes is the backend quota the cluster runs with, exported when
	// a member does not report its own (etcd before 3.6). Default
	// DefaultQuotaBytes.
	QuotaBytes int64
	// Timeout bounds one round of reads. Default 5 s.
	Timeout time.Duration
	// Registerer receives the metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Logger receives alarm transitions. Default: discard.
	Logger *slog.Logger
}

func (c MonitorConfig) withDefaults() MonitorConfig {
	if c.Interval == 0 {
		c.Interval = DefaultMonitorInterval
	}
	if c.QuotaBytes == 0 {
		c.QuotaBytes = DefaultQuotaBytes
	}
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first bad field.
func (c MonitorConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Etcd == nil:
		return errors.New("etcdspace: MonitorConfig.Etcd is required")
	case c.Interval < 0:
		return errors.Newf("etcdspace: MonitorConfig.Interval %v is negative", c.Interval)
	case c.QuotaBytes < 0:
		return errors.Newf("etcdspace: MonitorConfig.QuotaBytes %d is negative", c.QuotaBytes)
	case c.Timeout < 0:
		return errors.Newf("etcdspace: MonitorConfig.Timeout %v is negative", c.Timeout)
	}
	return nil
}

// alarmNames are the alarms exported as idrange_etcd_alarm{alarm}, always
// present (0 or 1) so that an alert can say "== 1".
var alarmNames = []string{pb.AlarmType_NOSPACE.String(), pb.AlarmType_CORRUPT.String()}

// Monitor reads etcd's backend size per member and the cluster's alarms,
// exports them, and reports the NOSPACE alarm through Err.
type Monitor struct {
	cfg MonitorConfig
	log *slog.Logger

	backend *prometheus.GaugeVec
	inUse   *prometheus.GaugeVec
	quota   prometheus.Gauge
	alarm   *prometheus.GaugeVec

	mu      sync.Mutex
	noSpace error // nil unless NOSPACE is raised
}

// NewMonitor validates cfg and registers the metrics. Nothing runs until
// Run or Refresh.
func NewMonitor(cfg MonitorConfig) (*Monitor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m := &Monitor{
		cfg: cfg,
		log: cfg.Logger.With("component", "etcdspace"),
		backend: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "idrange", Subsystem: "etcd", Name: "backend_bytes",
			Help: "Size of the etcd member's backend database file (what the quota is checked against)."}, []string{"member"}),
		inUse: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "idrange", Subsystem: "etcd", Name: "backend_in_use_bytes",
			Help: "Bytes of the etcd member's backend in use; the rest is free pages that defragmentation returns."}, []string{"member"}),
		quota: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "idrange", Subsystem: "etcd", Name: "quota_bytes",
			Help: "etcd backend quota: as the members report it, else --etcd-quota-bytes."}),
		alarm: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "idrange", Subsystem: "etcd", Name: "alarm",
			Help: "1 while etcd has the alarm raised on any member (NOSPACE: writes refused, the replica is NOT_SERVING)."}, []string{"alarm"}),
	}
	m.quota.Set(float64(cfg.QuotaBytes))
	for _, a := range alarmNames {
		m.alarm.WithLabelValues(a).Set(0)
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{m.backend, m.inUse, m.quota, m.alarm} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, errors.Wrap(err, "etcdspace: register monitor metrics")
			}
		}
	}
	return m, nil
}

// Err is non-nil, wrapping ErrNoSpace and naming the member, while the last
// Refresh found the NOSPACE alarm raised. A replica's health check returns
// it, so the replica reports NOT_SERVING with that reason.
func (m *Monitor) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.noSpace
}

// Run refreshes every Interval until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		if err := m.Refresh(ctx); err != nil && ctx.Err() == nil {
			m.log.Debug("etcd space: refresh failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Refresh reads every endpoint's status (backend size, size in use, quota)
// and the cluster's alarms now. It returns the first read that failed; the
// alarm state changes only on a successful alarm read.
func (m *Monitor) Refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	var firstErr error
	quota := m.cfg.QuotaBytes
	for _, ep := range m.cfg.Etcd.Endpoints() {
		st, err := m.cfg.Etcd.Status(ctx, ep)
		if err != nil {
			firstErr = cmpErr(firstErr, errors.Wrapf(err, "etcd status of %s", ep))
			continue
		}
		member := memberID(st.Header.GetMemberId())
		m.backend.WithLabelValues(member).Set(float64(st.DbSize))
		m.inUse.WithLabelValues(member).Set(float64(st.DbSizeInUse))
		if st.DbSizeQuota > 0 {
			quota = st.DbSizeQuota
		}
	}
	m.quota.Set(float64(quota))
	resp, err := m.cfg.Etcd.AlarmList(ctx)
	if err != nil {
		return cmpErr(firstErr, errors.Wrap(err, "etcd alarm list"))
	}
	raised := map[string][]string{}
	for _, a := range resp.Alarms {
		name := a.Alarm.String()
		raised[name] = append(raised[name], memberID(a.MemberID))
	}
	for _, a := range alarmNames {
		v := 0.0
		if len(raised[a]) > 0 {
			v = 1
		}
		m.alarm.WithLabelValues(a).Set(v)
	}
	m.setNoSpace(raised[pb.AlarmType_NOSPACE.String()], quota)
	if members := raised[pb.AlarmType_CORRUPT.String()]; len(members) > 0 {
		m.log.Error("etcd alarm CORRUPT raised", "members", strings.Join(members, ","))
	}
	return firstErr
}

// setNoSpace records the NOSPACE state and logs its transitions.
func (m *Monitor) setNoSpace(members []string, quota int64) {
	var err error
	if len(members) > 0 {
		sort.Strings(members)
		err = errors.Newf("%w on member %s: backend over quota (%d bytes); compact, defragment, then `etcdctl alarm disarm`",
			ErrNoSpace, strings.Join(members, ","), quota)
	}
	m.mu.Lock()
	was := m.noSpace
	m.noSpace = err
	m.mu.Unlock()
	switch {
	case err != nil && was == nil:
		m.log.Error("etcd alarm NOSPACE raised: writes are refused; reporting NOT_SERVING", "err", err)
	case err == nil && was != nil:
		m.log.Info("etcd alarm NOSPACE cleared")
	}
}

// memberID formats a member ID as etcdctl prints it.
func memberID(id uint64) string { return fmt.Sprintf("%x", id) }

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}
