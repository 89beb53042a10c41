//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/tlsfiles"
)

// admissionBound is how long a new client may wait, under a flood of
// flood sockets that never start a call and reconnect as soon as they are
// shed, before its connection is admitted and safe (docs/operations/probes-and-limits.md,
// "Connection limits and timeouts"): at most flood - perListener flood
// connections wait in the listen backlog ahead of it, the listener admits
// perListener of them per shedAfter (a flood connection is shed once it
// has had shedAfter), and its own connection then sheds the flood's oldest
// after at most shedAfter more. From there the flood's address pays for
// every newcomer, so the client's handshake and call are its own time.
func admissionBound(flood, perListener int, shedAfter time.Duration) time.Duration {
	return time.Duration(max(flood-perListener, 0))*shedAfter/time.Duration(perListener) + shedAfter
}

// Acceptance (issue 35, "fair admission under a crowd"): a replica with
// mutual TLS and its open-file limit at 256 (32 gRPC connections) gets a
// sustained flood of 300 idle TCP connections from another address
// (127.0.0.2), each reconnecting as soon as the replica sheds it, so the
// cap is always full and the listen backlog always long. A new
// `rangesvc mint` must succeed within the admission bound plus what a mint
// takes without a flood (measured first, with slack for a loaded machine),
// 5 tries out of 5; the flood must be shed all along (the shed counter
// grows), and the process stays up.
func TestReconnectingIdleFloodSubprocess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the rangesvc binary")
	}
	const (
		openFiles = 256
		flood     = 300
		tries     = 5
		slack     = 2 * time.Second // a loaded 2-core machine: the mint process's start, a GC, the scheduler
	)
	needOpenFiles(t, flood+256)
	floodFrom := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}
	if c, err := (&net.Dialer{LocalAddr: floodFrom}).Dial("tcp", "127.0.0.1:1"); err != nil && !strings.Contains(err.Error(), "refused") {
		t.Fatalf("cannot dial from %v (loopback 127.0.0.0/8): %v", floodFrom, err)
	} else if err == nil {
		c.Close()
	}
	testenv.Binary(t)
	pki := newTestPKI(t, "minter")
	p := testenv.StartServe(t, testenv.ServeConfig{Region: 1, OpenFiles: openFiles, Args: pki.serverFlags("--handshake-timeout", "2s")})
	perListener := loggedCap(t, p.Stderr())
	mint := func() (time.Duration, error) {
		start := time.Now()
		code, out, errs := mintCmd(t, append([]string{"--target", p.GRPCAddr, "-n", "3", "--timeout", "30s"}, pki.clientFlags("minter")...)...)
		took := time.Since(start)
		if code != 0 || len(strings.Fields(out)) != 3 {
			return took, fmt.Errorf("mint: exit %d after %v, stdout %q, stderr %s", code, took.Round(time.Millisecond), out, errs)
		}
		return took, nil
	}
	var calm time.Duration // the slowest mint without a flood (the first waits for the replica's restart floor)
	for range 3 {
		took, err := mint()
		if err != nil {
			t.Fatal(err)
		}
		calm = max(calm, took)
	}
	bound := admissionBound(flood, perListener, maxShedAfter) + calm + slack
	t.Logf("%d gRPC connections per listener, shed after %v: admission bound %v for a flood of %d; a mint takes %v without one; test bound %v",
		perListener, maxShedAfter, admissionBound(flood, perListener, maxShedAfter), flood, calm.Round(time.Millisecond), bound.Round(time.Millisecond))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		wg             sync.WaitGroup
		shed, refusals atomic.Int64
	)
	for range flood {
		wg.Go(func() {
			d := net.Dialer{LocalAddr: floodFrom, Timeout: 30 * time.Second}
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", p.GRPCAddr)
				if err != nil {
					refusals.Add(1)
					continue
				}
				stop := context.AfterFunc(ctx, func() { c.Close() })
				io.Copy(io.Discard, c) // idle until the replica closes it
				stop()
				c.Close()
				if ctx.Err() == nil {
					shed.Add(1)
				}
			}
		})
	}
	// The flood is on once it has filled the cap and is being shed.
	metricsTLS, err := tlsfiles.Files{CA: pki.ca}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	shedMetric := func() float64 {
		return metricValue(t, httpsGet(t, metricsTLS, "https://"+p.MetricsAddr+"/metrics"), `idrange_service_connections_shed_total{listener="grpc"}`)
	}
	for end := time.Now().Add(30 * time.Second); shed.Load() < 2*flood; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the flood was shed %d times in 30 s: it never filled the cap", shed.Load())
		}
	}
	before := shedMetric()
	var slowest time.Duration
	for i := range tries {
		took, err := mint()
		if err != nil {
			t.Errorf("try %d of %d under the flood: %v", i+1, tries, err)
			continue
		}
		t.Logf("try %d of %d: minted in %v", i+1, tries, took.Round(time.Millisecond))
		slowest = max(slowest, took)
		if took > bound {
			t.Errorf("try %d of %d: minted in %v, beyond the bound %v", i+1, tries, took, bound)
		}
	}
	after := shedMetric()
	cancel()
	wg.Wait()
	t.Logf("flood: %d connections shed by the replica in all (%v during the tries), %d dials failed; slowest mint under the flood %v",
		shed.Load(), after-before, refusals.Load(), slowest.Round(time.Millisecond))
	if after-before < float64(flood) {
		t.Errorf("the replica shed %v connections during the tries, want the flood (%d sockets) churning through the cap", after-before, flood)
	}
	select {
	case <-p.Done():
		t.Fatalf("rangesvc exited during the flood: %v\nstderr:\n%s", p.ExitErr(), p.Stderr())
	default:
	}
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatalf("SIGTERM after the flood: %v\nstderr:\n%s", err, p.Stderr())
	}
}
