package embedetcd

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

var loopbackHosts = []string{"127.0.0.1", "::1", "localhost"}

// snapshot reads every file of the PKI.
func snapshot(t *testing.T, p PKI) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, f := range []string{p.CACert, p.CAKey, p.ServerCert, p.ServerKey, p.ClientCert, p.ClientKey} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[f] = b
	}
	return out
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A fresh data dir gets a CA, a server certificate naming the hosts and a
// client certificate, both signed by the CA for their uses; keys 0600 in a
// 0700 directory.
func TestPKIFresh(t *testing.T) {
	now := time.Now()
	hosts := append(slices.Clone(loopbackHosts), "127.0.0.2", "etcd.example")
	p, err := ensurePKI(t.TempDir(), hosts, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Changes) != 3 || !strings.Contains(p.Changes[0], "made a new CA "+p.CACert) ||
		p.Changes[1] != "issued "+p.ServerCert || p.Changes[2] != "issued "+p.ClientCert {
		t.Fatalf("changes %q", p.Changes)
	}
	if fi, err := os.Stat(p.Dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("pki dir mode %v (%v), want 0700", fi.Mode().Perm(), err)
	}
	for _, k := range []string{p.CAKey, p.ServerKey, p.ClientKey} {
		if fi, err := os.Stat(k); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s mode %v (%v), want 0600", k, fi.Mode().Perm(), err)
		}
	}
	ca := readCert(t, p.CACert)
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	srv := readCert(t, p.ServerCert)
	for _, h := range hosts {
		if err := srv.VerifyHostname(h); err != nil {
			t.Errorf("server certificate: %v", err)
		}
	}
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := srv.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			t.Errorf("server certificate for usage %v: %v", u, err)
		}
	}
	cli := readCert(t, p.ClientCert)
	if _, err := cli.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate: %v", err)
	}
	if _, err := cli.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("the client certificate is good for a server too")
	}
	if got := ca.NotAfter.Sub(now); got < PKICAValidity-time.Minute {
		t.Errorf("CA valid for %v, want %v", got, PKICAValidity)
	}
}

// A second start reuses every file; a new listen host reissues only the
// server certificate; a certificate within PKIRenewBefore of its end is
// renewed; the CA is never replaced.
func TestPKIReuseAndRenew(t *testing.T) {
	dir, now := t.TempDir(), time.Now()
	p, err := ensurePKI(dir, loopbackHosts, now)
	if err != nil {
		t.Fatal(err)
	}
	first := snapshot(t, p)

	p, err = ensurePKI(dir, loopbackHosts, now.Add(time.Hour))
	if err != nil || len(p.Changes) != 0 {
		t.Fatalf("second start: changes %q, %v; want none", p.Changes, err)
	}
	for f, b := range snapshot(t, p) {
		if !bytes.Equal(b, first[f]) {
			t.Errorf("%s rewritten on reuse", f)
		}
	}

	p, err = ensurePKI(dir, append(slices.Clone(loopbackHosts), "127.0.0.2"), now)
	if err != nil || len(p.Changes) != 1 || !strings.Contains(p.Changes[0], "reissued "+p.ServerCert+": it did not name 127.0.0.2") {
		t.Fatalf("new host: changes %q, %v", p.Changes, err)
	}
	second := snapshot(t, p)
	for _, f := range []string{p.CACert, p.CAKey, p.ClientCert, p.ClientKey} {
		if !bytes.Equal(second[f], first[f]) {
			t.Errorf("%s rewritten for a new server host", f)
		}
	}
	if err := readCert(t, p.ServerCert).VerifyHostname("127.0.0.2"); err != nil {
		t.Error(err)
	}

	later := now.Add(PKILeafValidity - PKIRenewBefore + time.Hour)
	p, err = ensurePKI(dir, append(slices.Clone(loopbackHosts), "127.0.0.2"), later)
	if err != nil || len(p.Changes) != 2 || !strings.HasPrefix(p.Changes[0], "renewed "+p.ServerCert) ||
		!strings.HasPrefix(p.Changes[1], "renewed "+p.ClientCert) {
		t.Fatalf("near expiry: changes %q, %v", p.Changes, err)
	}
	third := snapshot(t, p)
	if !bytes.Equal(third[p.CACert], first[p.CACert]) || !bytes.Equal(third[p.CAKey], first[p.CAKey]) {
		t.Error("the CA was replaced by a leaf renewal")
	}
	if c := readCert(t, p.ClientCert); !c.NotAfter.After(later.Add(PKIRenewBefore)) {
		t.Errorf("renewed client certificate ends %v", c.NotAfter)
	}

	// A CA near its own end is not replaced: start fails, saying what to do.
	_, err = ensurePKI(dir, loopbackHosts, now.Add(PKICAValidity-PKIRenewBefore+time.Hour))
	if err == nil || !strings.Contains(err.Error(), "CA "+p.CACert+" expires") || !strings.Contains(err.Error(), "move "+p.Dir+" aside") {
		t.Fatalf("CA near expiry: %v", err)
	}
}

// A file that is there but unusable fails start naming it, and is left as
// it was: nothing is regenerated over it.
func TestPKIBadFilesFailStart(t *testing.T) {
	now := time.Now()
	other, err := ensurePKI(t.TempDir(), loopbackHosts, now) // another CA's files
	if err != nil {
		t.Fatal(err)
	}
	otherFiles := snapshot(t, other)
	for _, tc := range []struct {
		name  string
		spoil func(p PKI) (file string)
		want  string
	}{
		{"garbage CA certificate", func(p PKI) string { return write(t, p.CACert, "junk\n", 0o644) }, "does not hold exactly one PEM certificate"},
		{"garbage CA key", func(p PKI) string { return write(t, p.CAKey, "junk\n", 0o600) }, "does not parse or does not match"},
		{"garbage server certificate", func(p PKI) string { return write(t, p.ServerCert, "junk\n", 0o644) }, "does not hold exactly one PEM certificate"},
		{"truncated server key", func(p PKI) string {
			b, _ := os.ReadFile(p.ServerKey)
			return write(t, p.ServerKey, string(b[:len(b)/2]), 0o600)
		}, "does not parse or does not match"},
		{"client key of another pair", func(p PKI) string {
			b, _ := os.ReadFile(p.ServerKey)
			return write(t, p.ClientKey, string(b), 0o600)
		}, "does not parse or does not match"},
		{"server pair of another CA", func(p PKI) string {
			write(t, p.ServerKey, string(otherFiles[other.ServerKey]), 0o600)
			return write(t, p.ServerCert, string(otherFiles[other.ServerCert]), 0o644)
		}, "is not signed by the CA of its directory"},
		{"a CA that is not a CA", func(p PKI) string {
			write(t, p.CAKey, string(otherFiles[other.ClientKey]), 0o600)
			return write(t, p.CACert, string(otherFiles[other.ClientCert]), 0o644)
		}, "is not a CA certificate"},
		{"key readable by others", func(p PKI) string {
			if err := os.Chmod(p.ClientKey, 0o644); err != nil {
				t.Fatal(err)
			}
			return p.ClientKey
		}, "has mode -rw-r--r--; want 0600"},
		{"server key missing", func(p PKI) string {
			if err := os.Remove(p.ServerKey); err != nil {
				t.Fatal(err)
			}
			return p.ServerKey
		}, "is missing but its certificate"},
		{"CA certificate missing", func(p PKI) string {
			if err := os.Remove(p.CACert); err != nil {
				t.Fatal(err)
			}
			return p.CACert
		}, "is missing but its key"},
		{"pki dir open to others", func(p PKI) string {
			if err := os.Chmod(p.Dir, 0o755); err != nil {
				t.Fatal(err)
			}
			return p.Dir
		}, "want 0700"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p, err := ensurePKI(dir, loopbackHosts, now)
			if err != nil {
				t.Fatal(err)
			}
			file := tc.spoil(p)
			before := map[string][]byte{}
			for _, f := range []string{p.CACert, p.CAKey, p.ServerCert, p.ServerKey, p.ClientCert, p.ClientKey} {
				before[f], _ = os.ReadFile(f) // nil for a removed file
			}
			_, err = ensurePKI(dir, loopbackHosts, now)
			if err == nil || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ensurePKI = %v; want an error naming %s saying %q", err, file, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
			for f, b := range before {
				after, _ := os.ReadFile(f)
				if !bytes.Equal(after, b) {
					t.Errorf("%s was rewritten", f)
				}
			}
		})
	}
}

func write(t *testing.T, path, body string, mode os.FileMode) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	return path
}

// The server certificate names each listen host and the loopback names;
// a wildcard host adds this machine's name and addresses.
func TestServerHosts(t *testing.T) {
	u := func(s string) url.URL {
		p, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return *p
	}
	got := serverHosts(u("https://127.0.0.2:0"), u("https://localhost:2380"))
	if want := []string{"127.0.0.1", "::1", "localhost", "127.0.0.2"}; !slices.Equal(got, want) {
		t.Fatalf("serverHosts = %q, want %q", got, want)
	}
	got = serverHosts(u("https://0.0.0.0:2379"), u("https://[::]:2380"))
	if slices.Contains(got, "0.0.0.0") || slices.Contains(got, "::") {
		t.Fatalf("serverHosts %q names a wildcard", got)
	}
	if name, err := os.Hostname(); err == nil && !slices.Contains(got, name) {
		t.Errorf("serverHosts %q lacks the hostname %q", got, name)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() && !slices.Contains(got, n.IP.String()) {
			t.Errorf("serverHosts %q lacks the interface address %v", got, n.IP)
		}
	}
}
