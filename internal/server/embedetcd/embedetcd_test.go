package embedetcd_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/idrange/idrange/internal/server/embedetcd"
	"github.com/idrange/idrange/internal/server/embedetcd/embedetcdtest"
)

func TestStartPutRestartGet(t *testing.T) {
	s := embedetcdtest.Start(t)
	eps := s.Endpoints()
	if len(eps) != 1 || strings.HasSuffix(eps[0], ":0") || !strings.HasPrefix(eps[0], "http://127.0.0.1:") {
		t.Fatalf("endpoints %v: want one bound loopback address", eps)
	}
	cli := embedetcdtest.Client(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put, err := cli.Put(ctx, "/k", "v1")
	if err != nil {
		t.Fatal(err)
	}

	s.Stop()
	if s.Running() {
		t.Fatal("Running after Stop")
	}
	s.Stop() // idempotent
	if err := s.Start(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if got := s.Endpoints(); got[0] != eps[0] {
		t.Fatalf("restart moved endpoint %v -> %v", eps, got)
	}
	// The same client reconnects to the same address.
	resp, err := cli.Get(ctx, "/k")
	if err != nil {
		t.Fatalf("get after restart: %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v1" || resp.Kvs[0].ModRevision != put.Header.Revision {
		t.Fatalf("after restart got %v, want v1 at revision %d", resp.Kvs, put.Header.Revision)
	}
	if err := s.Start(ctx); err == nil {
		t.Fatal("second Start of a running server succeeded")
	}
}

func TestValidate(t *testing.T) {
	cases := map[string]embedetcd.Config{
		"Dir":                     {},
		"ClientURL":               {Dir: "x", ClientURL: "127.0.0.1:2379"},
		"PeerURL":                 {Dir: "x", PeerURL: "https://127.0.0.1:2380"},
		"both http or both https": {Dir: "x", ClientURL: "https://127.0.0.1:0"},
		"ElectionMs":              {Dir: "x", TickMs: 100, ElectionMs: 200},
		"TickMs":                  {Dir: "x", TickMs: 100},
	}
	for want, cfg := range cases {
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Validate() = %v, want an error naming %s", want, err, want)
		}
	}
	if err := (embedetcd.Config{Dir: "x"}).Validate(); err != nil {
		t.Errorf("minimal config: %v", err)
	}
}

// TestSecondMemberOnSameDirFailsFast: without the data dir lock etcd's
// backend would wait forever for the first member's file lock.
func TestSecondMemberOnSameDirFailsFast(t *testing.T) {
	s := embedetcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := embedetcd.Start(ctx, embedetcd.Config{Dir: s.Dir(), Logger: zap.NewNop()}); !errors.Is(err, embedetcd.ErrDirInUse) {
		t.Fatalf("second member on %s: %v, want ErrDirInUse", s.Dir(), err)
	}
	// After a Stop the directory is free again.
	s.Stop()
	s2, err := embedetcd.Start(ctx, embedetcd.Config{Dir: s.Dir(), Logger: zap.NewNop(), TickMs: embedetcd.BusyTickMs, ElectionMs: embedetcd.BusyElectionMs})
	if err != nil {
		t.Fatalf("member after Stop: %v", err)
	}
	s2.Stop()
}

func TestStartOnAFileFails(t *testing.T) {
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := embedetcd.Start(context.Background(), embedetcd.Config{Dir: f}); err == nil || !strings.Contains(err.Error(), f) {
		t.Fatalf("Start on a regular file: %v, want an error naming it", err)
	}
}

// The quota and etcd's own periodic compaction reach the member: it reports
// the quota, and history older than the retention becomes unreadable while
// the current value stays.
func TestQuotaAndAutoCompaction(t *testing.T) {
	const quota = 64 << 20
	s := embedetcdtest.StartConfig(t, embedetcd.Config{QuotaBackendBytes: quota, AutoCompactionRetention: time.Second})
	cli := embedetcdtest.Client(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, s.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	if st.DbSizeQuota != quota {
		t.Fatalf("member reports quota %d, want %d", st.DbSizeQuota, quota)
	}
	first, err := cli.Put(ctx, "/k", "v0")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for i := 1; ; i++ {
		if _, err := cli.Put(ctx, "/k", "v"+strings.Repeat("x", i%10)); err != nil {
			t.Fatal(err)
		}
		_, err := cli.Get(ctx, "/k", clientv3.WithRev(first.Header.Revision))
		if errors.Is(err, rpctypes.ErrCompacted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("revision %d still readable after 30 s with a 1 s auto-compaction retention", first.Header.Revision)
		}
		time.Sleep(50 * time.Millisecond) // write pace, not synchronisation
	}
	if got, err := cli.Get(ctx, "/k"); err != nil || len(got.Kvs) != 1 {
		t.Fatalf("current value after compaction: %v, %v", got, err)
	}
}

// With https URLs the member requires a client certificate of the PKI it
// made in Dir/pki; NewClient presents it; a restart reuses the PKI (and
// the client reconnects).
func TestSecuredMember(t *testing.T) {
	s := embedetcdtest.StartConfig(t, embedetcd.Config{ClientURL: "https://127.0.0.1:0", PeerURL: "https://127.0.0.1:0"})
	eps := s.Endpoints()
	if len(eps) != 1 || !strings.HasPrefix(eps[0], "https://127.0.0.1:") || strings.HasSuffix(eps[0], ":0") {
		t.Fatalf("endpoints %v: want one bound https loopback address", eps)
	}
	p := s.PKI()
	if p.Dir != filepath.Join(s.Dir(), embedetcd.PKIDirName) || len(p.Changes) != 3 {
		t.Fatalf("PKI %+v: want a new one in %s", p, s.Dir())
	}
	cli := embedetcdtest.Client(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/k", "v1"); err != nil {
		t.Fatal(err)
	}
	embedetcdtest.RequireClosed(t, eps[0], s.PeerEndpoint(), p)

	ca, err := os.ReadFile(p.CACert)
	if err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if err := s.Start(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if got := s.PKI(); len(got.Changes) != 0 {
		t.Fatalf("restart changed the PKI: %q", got.Changes)
	}
	if again, _ := os.ReadFile(p.CACert); !bytes.Equal(again, ca) {
		t.Fatal("restart replaced the CA")
	}
	if r, err := cli.Get(ctx, "/k"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("get after restart: %v, %v", r, err)
	}
}

// A bad PKI file fails Start naming it (the PKI's own cases are in
// pki_test.go).
func TestSecuredMemberBadPKIFailsStart(t *testing.T) {
	dir := t.TempDir()
	cfg := embedetcd.Config{Dir: dir, ClientURL: "https://127.0.0.1:0", PeerURL: "https://127.0.0.1:0", Logger: zap.NewNop()}
	s := embedetcdtest.StartConfig(t, cfg)
	key := s.PKI().ServerKey
	s.Stop()
	if err := os.WriteFile(key, []byte("junk\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Start(ctx); err == nil || !strings.Contains(err.Error(), key) {
		s.Stop()
		t.Fatalf("Start with a corrupt %s: %v, want an error naming it", key, err)
	}
}
