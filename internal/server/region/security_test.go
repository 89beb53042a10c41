package region_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/carve"
	"github.com/idrange/idrange/internal/server/authz"
	"github.com/idrange/idrange/internal/server/mintpool"
	"github.com/idrange/idrange/internal/server/region"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
	"github.com/idrange/idrange/internal/testing/testpki"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
	"github.com/idrange/idrange/tlsfiles"
)

// secureRegion is one mutual-TLS replica of region 1 on embedded etcd,
// with its PKI.
type secureRegion struct {
	r      *localregion.Region
	dir    string
	ca     *testpki.CA
	caFile string
	srv    testpki.Files
}

const capPerIdentity = 3

func startSecureRegion(t *testing.T) *secureRegion {
	t.Helper()
	s := &secureRegion{dir: t.TempDir()}
	var err error
	if s.ca, err = testpki.NewCA("idrange test CA"); err != nil {
		t.Fatal(err)
	}
	if s.caFile, err = s.ca.WriteFile(s.dir, "ca.crt"); err != nil {
		t.Fatal(err)
	}
	srv, err := s.ca.Server("replica-1")
	if err != nil {
		t.Fatal(err)
	}
	if s.srv, err = srv.WriteFiles(s.dir, "server"); err != nil {
		t.Fatal(err)
	}
	tc, err := tlsfiles.Files{Cert: s.srv.Cert, Key: s.srv.Key, CA: s.caFile}.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	allowed, err := authz.ParsePatterns("--tls-allowed-identities",
		[]string{"uri:spiffe://idrange.test/minter/*", "cn:minter-*"})
	if err != nil {
		t.Fatal(err)
	}
	s.r = regiontest.Start(t, localregion.Config{
		Region: 1, TLS: tc, AllowedIdentities: allowed,
		Store: store.Config{MaxCodesPerIdentity: capPerIdentity},
	})
	return s
}

// clientTLS is a client configuration trusting the test CA and presenting
// a certificate for id, issued by ca.
func (s *secureRegion) clientTLS(t *testing.T, ca *testpki.CA, id testpki.Identity) *tls.Config {
	t.Helper()
	c, err := ca.Client(id)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: s.ca.Pool(), Certificates: []tls.Certificate{c.TLS()}, MinVersion: tls.VersionTLS12}
}

// forcedTLS is clientTLS presenting its certificate even when the server
// does not list its CA as acceptable (Go's client would otherwise send
// none), so the server's own verification is what refuses it.
func (s *secureRegion) forcedTLS(t *testing.T, ca *testpki.CA, id testpki.Identity) *tls.Config {
	t.Helper()
	c, err := ca.Client(id)
	if err != nil {
		t.Fatal(err)
	}
	cert := c.TLS()
	return &tls.Config{RootCAs: s.ca.Pool(), MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }}
}

// alloc is the wire allocator over a new connection with creds.
func (s *secureRegion) alloc(t *testing.T, creds credentials.TransportCredentials) segment.Allocator {
	t.Helper()
	cc, err := grpc.NewClient(s.r.Addr(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return wire.NewAllocator(cc)
}

func (s *secureRegion) freeCodes(t *testing.T) int {
	t.Helper()
	n, err := s.r.Store().FreeCodes(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// etcdRev is the etcd store revision: it moves on every write.
func (s *secureRegion) etcdRev(t *testing.T) int64 {
	t.Helper()
	resp, err := s.r.Client().Get(context.Background(), "idrange-test/revision-probe")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Issue 10's acceptance on one mutual-TLS replica: refusals with their
// status codes, identity-bound leases, the per-identity cap, and
// certificate rotation.
func TestMutualTLS(t *testing.T) {
	s := startSecureRegion(t)

	t.Run("Refused", func(t *testing.T) {
		other, err := testpki.NewCA("another CA")
		if err != nil {
			t.Fatal(err)
		}
		noCert := &tls.Config{RootCAs: s.ca.Pool(), MinVersion: tls.VersionTLS12}
		for _, tc := range []struct {
			name  string
			creds credentials.TransportCredentials
			code  codes.Code
			msg   string
		}{
			// Refused at the TLS handshake: the client sees its connection
			// fail (Unavailable), never an answer. The message depends on
			// when the server's alert arrives ("certificate required",
			// "unknown certificate authority" or a broken pipe), so only
			// the code is checked.
			{"plaintext", insecure.NewCredentials(), codes.Unavailable, ""},
			{"no client certificate", credentials.NewTLS(noCert), codes.Unavailable, ""},
			{"certificate of another CA", credentials.NewTLS(s.forcedTLS(t, other, testpki.Identity{CN: "minter-x"})), codes.Unavailable, ""},
			// Verified, but not allowed.
			{"identity not allowed", credentials.NewTLS(s.clientTLS(t, s.ca, testpki.Identity{CN: "stranger", DNS: "stranger.test"})), codes.PermissionDenied, `"dns:stranger.test"`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				free := s.freeCodes(t)
				a := s.alloc(t, tc.creds)
				_, err := a.Acquire(ctxT(t), 1, tc.name)
				if got := status.Code(err); got != tc.code || !strings.Contains(fmt.Sprint(err), tc.msg) {
					t.Fatalf("Acquire: code %v (%v), want %v saying %q", got, err, tc.code, tc.msg)
				}
				if tc.code == codes.PermissionDenied && !errors.Is(err, segment.ErrPermissionDenied) {
					t.Fatalf("Acquire: %v does not wrap segment.ErrPermissionDenied", err)
				}
				if after := s.freeCodes(t); after != free {
					t.Fatalf("free codes %d before, %d after a refused client", free, after)
				}
			})
		}
	})

	t.Run("AllowedClientMints", func(t *testing.T) {
		c, err := s.ca.Client(testpki.Identity{URI: "spiffe://idrange.test/minter/m1", CN: "ignored"})
		if err != nil {
			t.Fatal(err)
		}
		files, err := c.WriteFiles(s.dir, "m1")
		if err != nil {
			t.Fatal(err)
		}
		tc, err := tlsfiles.Files{Cert: files.Cert, Key: files.Key, CA: s.caFile}.ClientConfig()
		if err != nil {
			t.Fatal(err)
		}
		ctx := ctxT(t)
		cl, err := rangeclient.New(ctx, rangeclient.Config{Targets: []string{s.r.Addr()}, TLS: tc, Owner: "m1"})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		if _, err := cl.Next(ctx); err != nil {
			t.Fatal(err)
		}
		infos, err := s.r.Store().List(ctx, 1)
		if err != nil || len(infos) != 1 || infos[0].Identity != "uri:spiffe://idrange.test/minter/m1" || infos[0].Owner != "m1" {
			t.Fatalf("leases %+v, %v; want one, bound to the client's URI SAN", infos, err)
		}
	})

	t.Run("LeaseBoundToIdentity", func(t *testing.T) {
		ctx := ctxT(t)
		a := s.alloc(t, credentials.NewTLS(s.clientTLS(t, s.ca, testpki.Identity{CN: "minter-a"})))
		b := s.alloc(t, credentials.NewTLS(s.clientTLS(t, s.ca, testpki.Identity{CN: "minter-b"})))
		la, err := a.Acquire(ctx, 1, "a")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Allocate(ctx, la, 4096); err != nil {
			t.Fatal(err)
		}
		// Identity first, and one answer (issue 35): whatever B names on
		// A's code (the right lease, a guessed lease id, an older or newer
		// token, a token above etcd's revision), it gets PermissionDenied
		// with the same message, which names the code and nothing about
		// A's lease (no token, revision or lease id: no digit after the
		// code). So B cannot tell a right guess from a wrong one, nor learn
		// the revision. A code nobody holds is answered the same way.
		prefix := fmt.Sprintf("region 1 worker %d: ", la.Worker)
		var first string
		refused := func(what string, err error) {
			t.Helper()
			msg := status.Convert(err).Message()
			if status.Code(err) != codes.PermissionDenied || !strings.HasPrefix(msg, prefix) || strings.ContainsAny(msg[len(prefix):], "0123456789") {
				t.Fatalf("%s: %v; want PermissionDenied with a message %q... and no number after it", what, err, prefix)
			}
			if first == "" {
				first = msg
			} else if msg != first {
				t.Fatalf("%s: message %q, another guess got %q: the answer tells guesses apart", what, msg, first)
			}
		}
		with := func(f func(*segment.Lease)) segment.Lease { l := la; f(&l); return l }
		guesses := []segment.Lease{
			la,
			with(func(l *segment.Lease) { l.LeaseID++ }),
			with(func(l *segment.Lease) { l.Token-- }),
			with(func(l *segment.Lease) { l.Token++ }),
			with(func(l *segment.Lease) { l.Token += 1 << 40 }), // above etcd's revision
		}
		replay := func() {
			t.Helper()
			for _, l := range guesses {
				_, err := b.Renew(ctx, l)
				refused("B renews A's lease", err)
				refused("B releases A's lease", b.Release(ctx, l))
				_, err = b.Allocate(ctx, l, 4096)
				refused("B allocates on A's lease", err)
			}
			free := with(func(l *segment.Lease) { l.Worker = (la.Worker + 1) % 256 })
			_, err := b.Allocate(ctx, free, 4096)
			if want := fmt.Sprintf("region 1 worker %d: %s", free.Worker, first[len(prefix):]); status.Code(err) != codes.PermissionDenied ||
				status.Convert(err).Message() != want {
				t.Fatalf("B allocates on a code nobody holds: %v; want PermissionDenied %q", err, want)
			}
		}
		// Quiet: B's calls write nothing to etcd.
		rev := s.etcdRev(t)
		replay()
		if after := s.etcdRev(t); after != rev {
			t.Fatalf("etcd revision %d before B's calls, %d after: B changed something", rev, after)
		}
		// Concurrent: A mints throughout B's attempts without one error.
		stop := make(chan struct{})
		var (
			wg     sync.WaitGroup
			grants int
			aErr   error
		)
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if i%10 == 0 {
					if _, err := a.Renew(ctx, la); err != nil {
						aErr = fmt.Errorf("A's renewal %d: %w", i, err)
						return
					}
				}
				if _, err := a.Allocate(ctx, la, 4096); err != nil {
					aErr = fmt.Errorf("A's grant %d: %w", i, err)
					return
				}
				grants++
			}
		})
		for range 20 {
			replay()
		}
		close(stop)
		wg.Wait()
		if aErr != nil || grants == 0 {
			t.Fatalf("A minting while B replays: %d grants, error %v", grants, aErr)
		}
		if err := a.Release(ctx, la); err != nil {
			t.Fatalf("A releases its own lease: %v", err)
		}
	})

	t.Run("CapPerIdentity", func(t *testing.T) {
		ctx := ctxT(t)
		c := s.alloc(t, credentials.NewTLS(s.clientTLS(t, s.ca, testpki.Identity{CN: "minter-greedy"})))
		for i := range capPerIdentity {
			if _, err := c.Acquire(ctx, 1, "greedy"); err != nil {
				t.Fatalf("acquire %d of %d: %v", i+1, capPerIdentity, err)
			}
		}
		free := s.freeCodes(t)
		_, err := c.Acquire(ctx, 1, "greedy")
		if status.Code(err) != codes.ResourceExhausted || !errors.Is(err, segment.ErrCodeCap) ||
			!strings.Contains(err.Error(), fmt.Sprintf("cap is %d", capPerIdentity)) {
			t.Fatalf("acquire %d: %v, want ResourceExhausted naming the cap %d", capPerIdentity+1, err, capPerIdentity)
		}
		if after := s.freeCodes(t); after != free {
			t.Fatalf("free codes %d before, %d after the refused acquisition", free, after)
		}
		d := s.alloc(t, credentials.NewTLS(s.clientTLS(t, s.ca, testpki.Identity{CN: "minter-modest"})))
		if _, err := d.Acquire(ctx, 1, "modest"); err != nil {
			t.Fatalf("another identity: %v", err)
		}
	})

	t.Run("ServerCertificateRotation", func(t *testing.T) {
		ctx := ctxT(t)
		cliTLS := s.clientTLS(t, s.ca, testpki.Identity{CN: "minter-rot"})
		cl, err := rangeclient.New(ctx, rangeclient.Config{Targets: []string{s.r.Addr()}, TLS: cliTLS, Owner: "rot",
			RefillInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		if _, err := cl.Next(ctx); err != nil {
			t.Fatal(err)
		}
		serverCN := func() string {
			t.Helper()
			conn, err := tls.Dial("tcp", s.r.Addr(), cliTLS)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
		}
		if cn := serverCN(); cn != "replica-1" {
			t.Fatalf("server certificate %q before rotation", cn)
		}
		next, err := s.ca.Server("replica-1-rotated")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := next.WriteFiles(s.dir, "server"); err != nil {
			t.Fatal(err)
		}
		if cn := serverCN(); cn != "replica-1-rotated" {
			t.Fatalf("a new connection after rotation sees %q, want the new certificate", cn)
		}
		// The established client keeps minting, across fresh grants.
		before := cl.Stats().Refills
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end) && cl.Stats().Refills < before+3; {
			if _, err := cl.NextN(ctx, 4096); err != nil {
				t.Fatalf("established client after rotation: %v", err)
			}
		}
		if cl.Stats().Refills < before+3 {
			t.Fatalf("established client made %d grants after rotation, want 3", cl.Stats().Refills-before)
		}
	})
}

// identityMinter records the caller identity its NextFunc was opened with.
type identityMinter struct{ opened chan string }

func (m identityMinter) open(ctx context.Context, _ segment.Allocator, _ int) (mintpool.Minter, error) {
	m.opened <- authz.IdentityFrom(ctx)
	return fixedMinter{}, nil
}

type fixedMinter struct{}

func (fixedMinter) AppendN(_ context.Context, dst []snowflake.ID, n int) ([]snowflake.ID, error) {
	for range n {
		dst = append(dst, 1)
	}
	return dst, nil
}
func (fixedMinter) Close() error { return nil }
func (fixedMinter) Carve(context.Context, carve.Request) (segment.Block, error) {
	return segment.Block{}, carve.ErrNotCarver
}

// serveMinterReplica serves a replica of s's region over mutual TLS with
// m as its Next minter and the given shared rate, stopped when the test
// ends, and returns it with its address.
func serveMinterReplica(t *testing.T, s *secureRegion, m identityMinter, sharedRate float64) (*region.Replica, string) {
	t.Helper()
	tc, err := tlsfiles.Files{Cert: s.srv.Cert, Key: s.srv.Key, CA: s.caFile}.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	rep, err := region.NewReplica(region.ReplicaConfig{Region: 1, Etcd: s.r.Client(), TLS: tc, Next: m.open, InitRegion: true, SharedRate: sharedRate})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rep.Serve(lis)
	t.Cleanup(func() { rep.Stop(0) })
	return rep, lis.Addr().String()
}

// The replica's own Next minter takes its lease as the replica, not as the
// mTLS caller whose Next call happened to open it: its renewals come from
// its background loop, with no caller, and would be refused otherwise.
func TestNextMinterLeaseHasNoCallerIdentity(t *testing.T) {
	s := startSecureRegion(t)
	m := identityMinter{opened: make(chan string, 1)}
	// The shared path off: the minter opens on the first call (with the
	// shared path on it opens at Serve, TestSharedPathOpensMinterAtStart).
	_, addr := serveMinterReplica(t, s, m, -1)
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(
		credentials.NewTLS(s.clientTLS(t, s.ca, testpki.Identity{CN: "minter-next"}))))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := idrangev1.NewRangeServiceClient(cc).Next(ctxT(t), &idrangev1.NextRequest{}); err != nil {
		t.Fatal(err)
	}
	if id := <-m.opened; id != "" {
		t.Fatalf("the Next minter was opened with caller identity %q; want none", id)
	}
}

// With the shared path on, a replica opens its Next minter when it starts
// serving, before any call: the shared path carves from the minter's code,
// which must be held before clients can take every code of the region.
func TestSharedPathOpensMinterAtStart(t *testing.T) {
	s := startSecureRegion(t)
	m := identityMinter{opened: make(chan string, 1)}
	rep, _ := serveMinterReplica(t, s, m, 0)
	select {
	case id := <-m.opened:
		if id != "" {
			t.Fatalf("the minter was opened with identity %q; want the replica's own (none)", id)
		}
	case <-ctxT(t).Done():
		t.Fatal("the minter was not opened at start with the shared path on")
	}
	info, err := rep.Service().GetReplicaInfo(ctxT(t), &idrangev1.GetReplicaInfoRequest{})
	if err != nil || !info.GetSharedPath() || info.GetCodesHeld() != 1 {
		t.Fatalf("replica info %v, %v: want the shared path on and 1 code held", info, err)
	}
}
