package embedetcd

import (
	"net"
	"net/url"
	"testing"
)

// A wildcard listen host is dialled on loopback (which the server
// certificate names); the bound port replaces the configured one and the
// configured host stays.
func TestEndpointOfWildcard(t *testing.T) {
	for _, tc := range []struct{ cfg, bound, want string }{
		{"https://0.0.0.0:0", "[::]:2379", "https://127.0.0.1:2379"},
		{"https://[::]:0", "[::]:2380", "https://[::1]:2380"},
		{"https://127.0.0.2:0", "127.0.0.2:4001", "https://127.0.0.2:4001"},
		{"http://localhost:0", "127.0.0.1:4002", "http://localhost:4002"},
	} {
		u, err := url.Parse(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		bound, err := net.ResolveTCPAddr("tcp", tc.bound)
		if err != nil {
			t.Fatal(err)
		}
		u.Host = withPort(*u, bound)
		if got := dialable(*u); got != tc.want {
			t.Errorf("%s bound on %s: endpoint %s, want %s", tc.cfg, tc.bound, got, tc.want)
		}
	}
}
