package authz

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/idrange/idrange/internal/testing/testpki"
)

func cert(t *testing.T, id testpki.Identity) *x509.Certificate {
	t.Helper()
	ca, err := testpki.NewCA("ca")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ca.Client(id)
	if err != nil {
		t.Fatal(err)
	}
	return c.Cert
}

func TestIdentityPrefersURIThenDNSThenCN(t *testing.T) {
	for _, tc := range []struct {
		id   testpki.Identity
		want string
	}{
		{testpki.Identity{CN: "c", DNS: "d.test", URI: "spiffe://t/u"}, "uri:spiffe://t/u"},
		{testpki.Identity{CN: "c", DNS: "d.test"}, "dns:d.test"},
		{testpki.Identity{CN: "c"}, "cn:c"},
		{testpki.Identity{}, ""},
	} {
		if got := Identity(cert(t, tc.id)); got != tc.want {
			t.Errorf("Identity(%+v) = %q, want %q", tc.id, got, tc.want)
		}
	}
}

func TestPatterns(t *testing.T) {
	ps, err := ParsePatterns("--f", []string{"uri:spiffe://t/minter/*", "dns:*.prod.test", "cn:admin-?"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"uri:spiffe://t/minter/a", true},
		{"uri:spiffe://t/minter/a/b", false}, // * does not cross /
		{"uri:spiffe://t/other/a", false},
		{"dns:m1.prod.test", true},
		{"dns:prod.test", false},
		{"cn:admin-1", true},
		{"cn:admin-12", false},
		{"dns:admin-1", false}, // kinds do not mix
		{"cn:m1.prod.test", false},
	} {
		if got := matchAny(ps, []string{tc.name}); got != tc.want {
			t.Errorf("match %q = %v, want %v", tc.name, got, tc.want)
		}
	}
	for _, bad := range []string{"minter", "email:a@b", "cn:", "uri:spiffe://t/[", "", ":x"} {
		_, err := ParsePatterns("--tls-allowed-identities", []string{bad})
		if err == nil || !strings.HasPrefix(err.Error(), "--tls-allowed-identities: ") || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParsePatterns(%q) = %v, want a one-line error naming the flag", bad, err)
		}
	}
}

// tlsPeer is the context of an RPC from a caller with cert (nil: a TLS
// connection without a client certificate).
func tlsPeer(c *x509.Certificate) context.Context {
	st := tls.ConnectionState{}
	if c != nil {
		st.PeerCertificates = []*x509.Certificate{c}
		st.VerifiedChains = [][]*x509.Certificate{{c}}
	}
	return peer.NewContext(context.Background(), &peer.Peer{
		Addr:     &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)},
		AuthInfo: credentials.TLSInfo{State: st},
	})
}

func TestAuthorize(t *testing.T) {
	allowed, _ := ParsePatterns("a", []string{"cn:minter-*"})
	admins, _ := ParsePatterns("b", []string{"cn:ops"})
	minter := cert(t, testpki.Identity{CN: "minter-1"})
	ops := cert(t, testpki.Identity{CN: "ops"})
	stranger := cert(t, testpki.Identity{CN: "stranger", DNS: "stranger.test"})
	plain := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}})
	const acquire = "/idrange.v1.RangeService/AcquireLease"
	const health = "/grpc.health.v1.Health/Check"
	const admin = "/idrange.v1.AdminService/FenceCode"

	for _, tc := range []struct {
		name   string
		policy Policy
		ctx    context.Context
		method string
		code   codes.Code
		id     string
	}{
		{"allowed minter", Policy{Allowed: allowed, Admin: admins}, tlsPeer(minter), acquire, codes.OK, "cn:minter-1"},
		{"stranger", Policy{Allowed: allowed, Admin: admins}, tlsPeer(stranger), acquire, codes.PermissionDenied, ""},
		{"any cert when no allow list", Policy{Admin: admins}, tlsPeer(stranger), acquire, codes.OK, "dns:stranger.test"},
		{"admin on the range service", Policy{Allowed: allowed, Admin: admins}, tlsPeer(ops), acquire, codes.OK, "cn:ops"},
		{"admin method by admin", Policy{Allowed: allowed, Admin: admins}, tlsPeer(ops), admin, codes.OK, "cn:ops"},
		{"admin method by minter", Policy{Allowed: allowed, Admin: admins}, tlsPeer(minter), admin, codes.PermissionDenied, ""},
		{"admin method, no admins", Policy{}, tlsPeer(ops), admin, codes.PermissionDenied, ""},
		{"health by stranger", Policy{Allowed: allowed}, tlsPeer(stranger), health, codes.OK, "dns:stranger.test"},
		{"no client certificate", Policy{}, tlsPeer(nil), acquire, codes.Unauthenticated, ""},
		{"plaintext", Policy{}, plain, health, codes.Unauthenticated, ""},
		{"no peer", Policy{}, context.Background(), acquire, codes.Unauthenticated, ""},
		{"certificate without names", Policy{}, tlsPeer(cert(t, testpki.Identity{})), acquire, codes.Unauthenticated, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, err := tc.policy.Authorize(tc.ctx, tc.method)
			if got := status.Code(err); got != tc.code {
				t.Fatalf("code %v (%v), want %v", got, err, tc.code)
			}
			if err == nil && IdentityFrom(ctx) != tc.id {
				t.Fatalf("identity in context %q, want %q", IdentityFrom(ctx), tc.id)
			}
		})
	}
}
