package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/tlsfiles"
)

// rangesvc serve serves the shared path under mutual TLS with the same
// authorisation as minting: an allowed identity's Codes-0 client mints
// without a code of its own; an identity that may not mint gets
// PermissionDenied from New (final, not retried); --shared-rate 0 gives
// clients a code instead.
func TestSharedPathServeMutualTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess test: skipped with -short")
	}
	p := newTestPKI(t, "minter-1", "intruder")
	srv := testenv.StartServe(t, testenv.ServeConfig{Region: 2, Args: p.serverFlags("--tls-allowed-identities", "cn:minter-*")})
	off := testenv.StartServe(t, testenv.ServeConfig{Region: 2, Args: p.serverFlags("--tls-allowed-identities", "cn:minter-*",
		"--shared-rate", "0")})
	client := func(cn, target string) (*rangeclient.Client, error) {
		tc, err := tlsfiles.Files{Cert: p.clients[cn].Cert, Key: p.clients[cn].Key, CA: p.ca}.ClientConfig()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := rangeclient.New(ctx, rangeclient.Config{Targets: []string{target}, TLS: tc, Owner: cn})
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
		return c, err
	}
	c, err := client("minter-1", srv.GRPCAddr)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ids, err := c.NextN(context.Background(), 1000)
	if err != nil || len(ids) != 1000 {
		t.Fatalf("NextN on the shared path: %d IDs, %v", len(ids), err)
	}
	testenv.CheckIDs(t, ids, 2, start)
	if li := c.Lease(); !li.Shared || li.Lease.Region != 2 {
		t.Fatalf("Codes 0 against rangesvc serve: lease %+v, want the shared path in region 2", li)
	}
	if _, err := client("intruder", srv.GRPCAddr); !errors.Is(err, segment.ErrPermissionDenied) {
		t.Fatalf("New as an identity that may not mint: %v, want ErrPermissionDenied", err)
	}
	c2, err := client("minter-1", off.GRPCAddr)
	if err != nil {
		t.Fatal(err)
	}
	if li := c2.Lease(); li.Shared || li.Lease.Token <= 0 {
		t.Fatalf("Codes 0 against --shared-rate 0: lease %+v, want a code", li)
	}
}
