package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/tlsfiles"
)

// The admin commands over mutual TLS: an admin identity lists the leases
// (each with the identity that holds it) and fences a code; a client
// identity that may mint is refused the admin RPCs and fences nothing.
func TestAdminOverMutualTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess test: skipped with -short")
	}
	p := newTestPKI(t, "minter-1", "operator")
	srv := testenv.StartServe(t, testenv.ServeConfig{Region: 2, Args: p.serverFlags(
		"--tls-allowed-identities", "cn:minter-*", "--tls-admin-identities", "cn:operator",
	)})
	as := func(cn string, args ...string) []string {
		return append(append(args, "--target", srv.GRPCAddr, "--timeout", "10s"), p.clientFlags(cn)...)
	}

	tc, err := tlsfiles.Files{Cert: p.clients["minter-1"].Cert, Key: p.clients["minter-1"].Key, CA: p.ca}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Codes 1: a client with a lease to list and fence (rangesvc serve
	// serves the shared path, on which a client holds none).
	c, err := rangeclient.New(ctx, rangeclient.Config{Targets: []string{srv.GRPCAddr}, TLS: tc, Codes: 1, Owner: "admin-tls"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Next(ctx); err != nil {
		t.Fatal(err)
	}
	worker := c.Lease().Lease.Worker

	// Two leases: the client's, under its identity, and the replica's own
	// minter's (the shared path carves from it), under none.
	got := adminJSON[leasesJSON](t, as("operator", "leases")...)
	var mine, minter int
	for _, l := range got.Leases {
		switch {
		case l.Worker == worker && l.Identity == "cn:minter-1":
			mine++
		case l.Identity == "" && strings.HasPrefix(l.Owner, "rangesvc Next"):
			minter++
		}
	}
	if len(got.Leases) != 2 || mine != 1 || minter != 1 {
		t.Fatalf("leases as the operator: %+v, want worker %d held by cn:minter-1 and the replica's minter's", got.Leases, worker)
	}

	code, out, errs := runCmd(append([]string{"admin"}, as("minter-1", "fence", "--worker", strconv.Itoa(worker))...)...)
	if code != cli.ExitFailure || out != "" || !strings.Contains(strings.ToLower(errs), "permission") {
		t.Fatalf("fence as a minting identity: exit %d, stdout %q, stderr %q; want exit 1, permission denied", code, out, errs)
	}
	if st := c.Stats(); st.Fenced != 0 {
		t.Fatalf("a refused fence fenced the client: %+v", st)
	}

	code, _, errs = runCmd(append([]string{"admin"}, as("operator", "fence", "--worker", strconv.Itoa(worker))...)...)
	if code != cli.ExitOK {
		t.Fatalf("fence as the operator: exit %d, stderr %q", code, errs)
	}
	for c.Stats().Fenced == 0 {
		if ctx.Err() != nil {
			t.Fatalf("the client was not fenced: %+v", c.Stats())
		}
		time.Sleep(20 * time.Millisecond) // the owner learns of the fence at its next renewal or grant

	}
}
