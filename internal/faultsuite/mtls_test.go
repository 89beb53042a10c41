package faultsuite

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/idrange/idrange/internal/testing/testpki"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
)

// suitePKI is the certificates of an options.mtls deployment: one CA, a
// server certificate for the replicas, a client certificate per minter
// (CN = the minter's name) and one for an intruder, all allowed identities.
type suitePKI struct {
	t      *testing.T
	dir    string
	ca     *testpki.CA
	caFile string
	server testpki.Files
}

// allowedIdentities lets the minters (m0, m1, ...) and the intruder in.
const allowedIdentities = "cn:m*,cn:intruder"

func newSuitePKI(t *testing.T, dir string) *suitePKI {
	t.Helper()
	p := &suitePKI{t: t, dir: dir}
	var err error
	if p.ca, err = testpki.NewCA("faultsuite CA"); err != nil {
		t.Fatal(err)
	}
	if p.caFile, err = p.ca.WriteFile(dir, "ca.crt"); err != nil {
		t.Fatal(err)
	}
	srv, err := p.ca.Server("rangesvc")
	if err != nil {
		t.Fatal(err)
	}
	if p.server, err = srv.WriteFiles(dir, "server"); err != nil {
		t.Fatal(err)
	}
	return p
}

// replicaArgs are rangesvc serve's mutual-TLS flags (none without mTLS).
func (p *suitePKI) replicaArgs() []string {
	if p == nil {
		return nil
	}
	return []string{"--tls-cert", p.server.Cert, "--tls-key", p.server.Key, "--tls-client-ca", p.caFile,
		"--tls-allowed-identities", allowedIdentities}
}

// minterArgs issues the minter's certificate and returns its TLS flags.
func (p *suitePKI) minterArgs(name string) []string {
	if p == nil {
		return nil
	}
	c, err := p.ca.Client(testpki.Identity{CN: name})
	if err != nil {
		p.t.Fatal(err)
	}
	f, err := c.WriteFiles(p.dir, name)
	if err != nil {
		p.t.Fatal(err)
	}
	return []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", p.caFile}
}

// clientCreds is a client certificate for cn as gRPC credentials.
func (p *suitePKI) clientCreds(cn string) credentials.TransportCredentials {
	c, err := p.ca.Client(testpki.Identity{CN: cn})
	if err != nil {
		p.t.Fatal(err)
	}
	return credentials.NewTLS(&tls.Config{RootCAs: p.ca.Pool(), Certificates: []tls.Certificate{c.TLS()}, MinVersion: tls.VersionTLS12})
}

// TestMutualTLSIntruderAndReplicaKill runs the deployment over mutual TLS
// (identity-bound leases): while the minters run, an intruder with another
// allowed identity replays minter m0's exact lease fields on RenewLease,
// ReleaseLease and AllocateBlock through both replicas and is refused with
// PermissionDenied every time, m0 keeps its lease and mints on; then a
// replica is killed mid-grants and restarted, as in
// TestRangesvcReplicaKillMidGrants. The checker then proves nothing was
// handed out twice or unsafely.
func TestMutualTLSIntruderAndReplicaKill(t *testing.T) {
	s := newSuite(t, options{refill: 50 * time.Millisecond, mtls: true})
	s.waitMinting(s.mono0, 2000, time.Minute)

	m0 := s.minters[0]
	worker, token := m0.currentCode()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	infos, err := s.store.List(ctx, region)
	if err != nil {
		t.Fatal(err)
	}
	var victim segment.Lease
	for _, in := range infos {
		if in.Worker == worker && in.Token == token {
			victim = in.Lease
			if in.Identity != "cn:"+m0.name {
				t.Fatalf("m0's lease is bound to %q, want cn:%s", in.Identity, m0.name)
			}
		}
	}
	if victim.Token == 0 {
		t.Fatalf("m0's lease (worker %d token %d) is not in etcd", worker, token)
	}
	k := s.fault("intruder replays %s's lease (worker %d token %d) on both replicas", m0.name, worker, token)
	creds := s.pki.clientCreds("intruder")
	for _, r := range s.replicas {
		cc, err := grpc.NewClient(r.addr(), grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		a := wire.NewAllocator(cc)
		for range 10 {
			if _, err := a.Renew(ctx, victim); status.Code(err) != codes.PermissionDenied {
				t.Fatalf("intruder Renew via %s: %v, want PermissionDenied", r.name, err)
			}
			if _, err := a.Allocate(ctx, victim, 4096); status.Code(err) != codes.PermissionDenied {
				t.Fatalf("intruder Allocate via %s: %v, want PermissionDenied", r.name, err)
			}
			if err := a.Release(ctx, victim); status.Code(err) != codes.PermissionDenied {
				t.Fatalf("intruder Release via %s: %v, want PermissionDenied", r.name, err)
			}
		}
		cc.Close()
	}
	s.waitMinting(k, 1000, time.Minute)
	if w, tok := m0.currentCode(); w != worker || tok != token {
		t.Fatalf("%s's lease changed from worker %d token %d to %d/%d: the intruder's calls took effect", m0.name, worker, token, w, tok)
	}
	if h := m0.progress(); len(h.Failures) > 0 {
		t.Fatalf("%s had %d failed minting calls while the intruder tried its lease; first: %+v", m0.name, len(h.Failures), h.Failures[0])
	}

	r0 := s.replicas[0]
	k2 := s.fault("kill -9 %s mid-grants (mTLS)", r0.name)
	r0.p.kill()
	s.hold(2 * time.Second)
	s.waitMinting(k2, 1000, time.Minute)
	s.mark("restart %s on %s", r0.name, r0.addr())
	r0.p.start()
	r0.p.waitReady(startTimeout)
	s.hold(time.Second)

	res := s.finish()
	f := s.figures(res)
	f.notes += "mutual TLS; the intruder's 60 replays were all refused"
	s.publish(f)
}
