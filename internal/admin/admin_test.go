package admin_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/admin"
	"github.com/idrange/idrange/internal/embedetcd/embedetcdtest"
	"github.com/idrange/idrange/internal/region"
	"github.com/idrange/idrange/internal/region/regiontest"
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
	r := regiontest.Start(t, region.Config{Region: 1, Etcd: embedetcdtest.Start(t)})
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
