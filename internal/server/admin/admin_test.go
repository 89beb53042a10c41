package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/server/admin"
	"github.com/idrange/idrange/internal/server/authz"
	"github.com/idrange/idrange/internal/server/embedetcd/embedetcdtest"
	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
)

func TestNewValidates(t *testing.T) {
	for name, cfg := range map[string]admin.Config{
		"Region":  {Region: 4},
		"Store":   {Region: 1},
		"Timeout": {Region: 1, Timeout: -time.Second},
	} {
		if _, err := admin.New(cfg); err == nil {
			t.Errorf("New with a bad %s: no error", name)
		}
	}
}

// The AdminService answers bad requests with InvalidArgument naming the
// field, a free code's fence with NotFound, a stale token's with
// FailedPrecondition, and refuses to disarm anything but NOSPACE.
func TestErrorCodes(t *testing.T) {
	if testing.Short() {
		t.Skip("real region: skipped with -short")
	}
	r := regiontest.Start(t, localregion.Config{Region: 1, Etcd: embedetcdtest.Start(t)})
	c := idrangev1.NewAdminServiceClient(regiontest.Dial(t, r.Addr()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := r.Store().Acquire(ctx, 1, "held")
	if err != nil {
		t.Fatal(err)
	}
	free := (l.Worker + 1) % 256
	for _, tc := range []struct {
		name string
		call func() error
		code codes.Code
		msg  string
	}{
		{"worker out of range", func() error {
			_, err := c.Fence(ctx, &idrangev1.FenceRequest{Worker: 256})
			return err
		}, codes.InvalidArgument, "worker"},
		{"negative token", func() error {
			_, err := c.Fence(ctx, &idrangev1.FenceRequest{Worker: 1, Token: -1})
			return err
		}, codes.InvalidArgument, "token"},
		{"free code", func() error {
			_, err := c.Fence(ctx, &idrangev1.FenceRequest{Worker: uint32(free)})
			return err
		}, codes.NotFound, "no owner"},
		{"stale token", func() error {
			_, err := c.Fence(ctx, &idrangev1.FenceRequest{Worker: uint32(l.Worker), Token: l.Token + 1000})
			return err
		}, codes.FailedPrecondition, "nothing fenced"},
		{"disarm CORRUPT", func() error {
			_, err := c.DisarmAlarm(ctx, &idrangev1.DisarmAlarmRequest{Type: "CORRUPT"})
			return err
		}, codes.InvalidArgument, "only NOSPACE"},
		{"disarm with no alarm", func() error {
			_, err := c.DisarmAlarm(ctx, &idrangev1.DisarmAlarmRequest{Type: "NOSPACE"})
			return err
		}, codes.NotFound, "no NOSPACE alarm"},
	} {
		err := tc.call()
		if st, _ := status.FromError(err); st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
			t.Errorf("%s: %v; want %v naming %q", tc.name, err, tc.code, tc.msg)
		}
	}
	// The held code is still held: none of the refused fences touched it.
	if _, err := r.Store().Renew(ctx, l); err != nil {
		t.Fatalf("held lease after refused fences: %v", err)
	}
	resp, err := c.Fence(ctx, &idrangev1.FenceRequest{Worker: uint32(l.Worker), Token: l.Token})
	if err != nil || resp.GetFenced().GetToken() != l.Token || resp.GetFenced().GetOwner() != "held" {
		t.Fatalf("Fence of the held code: %v, %v", resp, err)
	}
	if _, err := r.Store().Renew(ctx, l); err == nil {
		t.Fatal("fenced lease still renews")
	}
}

// Every fence is an audit line naming the caller's verified identity, its
// address, the operator's reason and what was fenced; a refused fence is
// one too. A reason that is not one printable line is refused before
// anything is done.
func TestFenceAuditLine(t *testing.T) {
	if testing.Short() {
		t.Skip("real region: skipped with -short")
	}
	r := regiontest.Start(t, localregion.Config{Region: 2, Etcd: embedetcdtest.Start(t)})
	var logs bytes.Buffer
	srv, err := admin.New(admin.Config{Region: 2, Store: r.Store(), Etcd: r.Client(),
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := r.Store().Acquire(ctx, 2, "held")
	if err != nil {
		t.Fatal(err)
	}
	opsCtx := peer.NewContext(authz.WithIdentity(ctx, "cn:ops-1"),
		&peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4242}})

	for _, bad := range []string{strings.Repeat("x", 257), "two\nlines", "bad \xff utf-8"} {
		_, err := srv.Fence(opsCtx, &idrangev1.FenceRequest{Worker: uint32(l.Worker), Reason: bad})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "reason") {
			t.Fatalf("reason %q: %v, want InvalidArgument naming reason", bad, err)
		}
	}
	if logs.Len() != 0 {
		t.Fatalf("refused requests logged: %s", logs.String())
	}
	if _, err := srv.Fence(opsCtx, &idrangev1.FenceRequest{Worker: uint32(l.Worker), Token: l.Token + 1000, Reason: "stale"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("fence by a stale token: %v", err)
	}
	if _, err := srv.Fence(opsCtx, &idrangev1.FenceRequest{Worker: uint32(l.Worker), Token: l.Token, Reason: "ticket OPS-17: stuck pod"}); err != nil {
		t.Fatal(err)
	}
	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 2 {
		t.Fatalf("%d audit lines, want 2 (the refused fence and the fence):\n%s", len(lines), logs.String())
	}
	for i, want := range []struct{ outcome, reason string }{{"failed", "stale"}, {"ok", "ticket OPS-17: stuck pod"}} {
		m := lines[i]
		if m["audit"] != true || m["action"] != "fence" || m["outcome"] != want.outcome || m["reason"] != want.reason ||
			m["identity"] != "cn:ops-1" || m["peer"] != "127.0.0.1:4242" || m["worker"] != float64(l.Worker) {
			t.Errorf("audit line %d: %v; want action fence, outcome %s, reason %q, identity cn:ops-1, peer, worker %d",
				i, m, want.outcome, want.reason, l.Worker)
		}
	}
	if m := lines[1]; m["token"] != float64(l.Token) || m["owner"] != "held" || m["lease_id"] != fmt.Sprintf("%x", l.LeaseID) {
		t.Errorf("audit line of the fence: %v; want token %d, owner held, lease_id %x", m, l.Token, l.LeaseID)
	}
}
