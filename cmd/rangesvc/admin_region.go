package main

import (
	"context"
	"fmt"
	"time"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
)

// regionRecordJSON is the region record in `rangesvc admin status -o json`
// and `restore-fence -o json`.
type regionRecordJSON struct {
	Region              int        `json:"region"`
	RegionID            string     `json:"region_id"`
	Created             time.Time  `json:"created"`
	Layout              int        `json:"layout"`
	EtcdClusterID       string     `json:"etcd_cluster_id"`
	RegistryClaimed     *time.Time `json:"registry_claimed,omitempty"` // absent: no confirmed claim
	RegistryClusterID   string     `json:"registry_cluster_id,omitempty"`
	RestorePending      bool       `json:"restore_pending"`
	RestoreReason       string     `json:"restore_reason,omitempty"`
	RestoreSince        *time.Time `json:"restore_since,omitempty"`
	Fenced              *time.Time `json:"fenced,omitempty"`
	FencedTo            *time.Time `json:"fenced_to,omitempty"`
	RecordFormatVersion int        `json:"v"`
}

func optTime(ms int64) *time.Time {
	if ms == 0 {
		return nil
	}
	t := unixMs(ms)
	return &t
}

func recordJSON(r *idrangev1.RegionRecord) *regionRecordJSON {
	if r == nil {
		return nil
	}
	return &regionRecordJSON{
		Region: int(r.GetRegion()), RegionID: r.GetRegionId(), Created: unixMs(r.GetCreatedUnixMs()),
		Layout: int(r.GetLayout()), EtcdClusterID: r.GetEtcdClusterId(),
		RegistryClaimed: optTime(r.GetRegistryClaimedUnixMs()), RegistryClusterID: r.GetRegistryClusterId(),
		RestorePending: r.GetRestorePending(), RestoreReason: r.GetRestoreReason(),
		RestoreSince: optTime(r.GetRestoreSinceUnixMs()), Fenced: optTime(r.GetFencedUnixMs()),
		FencedTo: optTime(r.GetFencedToUnixMs()), RecordFormatVersion: int(r.GetVersion()),
	}
}

// regionRows are status's table lines about the region identity.
func (s statusJSON) regionRows() [][2]string {
	check := s.RegionCheck
	if check == "" {
		check = "(not reported by this replica)"
	}
	r := s.RegionRecord
	if r == nil {
		return [][2]string{{"region record", "unreadable: " + s.RegionRecordError}, {"region check", check}}
	}
	claim := "none (no registry, or not confirmed yet)"
	if r.RegistryClaimed != nil {
		claim = fmt.Sprintf("confirmed %s on registry cluster %s", r.RegistryClaimed.Format(time.RFC3339), r.RegistryClusterID)
	}
	restore := "none pending"
	if r.RestorePending {
		restore = fmt.Sprintf("PENDING since %s: %s", r.RestoreSince.Format(time.RFC3339), r.RestoreReason)
	}
	fenced := "never"
	if r.Fenced != nil {
		fenced = fmt.Sprintf("%s (every HWM to %s)", r.Fenced.Format(time.RFC3339), r.FencedTo.Format(time.RFC3339Nano))
	}
	rows := [][2]string{
		{"region id", fmt.Sprintf("%s (created %s, layout %d, etcd cluster %s)", r.RegionID, r.Created.Format(time.RFC3339), r.Layout, r.EtcdClusterID)},
		{"registry claim", claim},
		{"restore", restore},
		{"last restore fence", fenced},
		{"region check", check},
	}
	if s.RegionRecordError != "" {
		rows = append(rows, [2]string{"region record", s.RegionRecordError})
	}
	return rows
}

// restoreFence runs the restore fence on the first replica that answers.
func (a *adminRun) restoreFence(ctx context.Context) error {
	var resp *idrangev1.RestoreFenceResponse
	by, err := a.first(ctx, func(c idrangev1.AdminServiceClient) (err error) {
		resp, err = c.RestoreFence(ctx, &idrangev1.RestoreFenceRequest{MarginMs: a.cfg.Margin.Milliseconds(), Reason: a.cfg.Reason})
		return err
	})
	if err != nil {
		return err
	}
	out := struct {
		AnsweredBy   string            `json:"answered_by"`
		CodesLifted  int               `json:"codes_lifted"`
		Transactions int               `json:"transactions"`
		Record       *regionRecordJSON `json:"region_record"`
	}{by, int(resp.GetCodesLifted()), int(resp.GetTransactions()), recordJSON(resp.GetRecord())}
	if a.cfg.Output == "json" {
		return a.json(out)
	}
	w := a.table()
	fmt.Fprintf(w, "answered by\t%s\n", out.AnsweredBy)
	fmt.Fprintf(w, "codes lifted\t%d (in %d etcd transactions)\n", out.CodesLifted, out.Transactions)
	if r := out.Record; r != nil && r.FencedTo != nil {
		fmt.Fprintf(w, "fenced to\t%s\n", r.FencedTo.Format(time.RFC3339Nano))
		fmt.Fprintf(w, "restore pending\t%v\n", r.RestorePending)
	}
	return w.Flush()
}
