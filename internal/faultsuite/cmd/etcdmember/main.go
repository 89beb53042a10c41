// Command etcdmember runs one member of an etcd cluster in its own process,
// for the fault suite: kill -9 and SIGSTOP then hit a real process, and the
// member runs the same etcd version (go.etcd.io/etcd/server/v3/embed) as the
// client library, with no system package needed.
//
//	etcdmember --name m0 --data-dir DIR --client-url http://127.0.0.1:P \
//	  --peer-url http://127.0.0.1:Q --initial-cluster m0=http://...,m1=... \
//	  [--cluster-state new|existing] [--tick-ms 100 --election-ms 2000]
//
// It prints "READY <client-url>" on stdout once the member serves clients
// (the cluster has a leader and the member has joined), and exits when
// SIGTERM/SIGINT arrives, when etcd fails, or, with --exit-on-stdin-eof,
// when its stdin is closed (the test process that started it is gone). Restarting it with the same
// --data-dir brings the member back with everything it had committed.
//
// URLs must be loopback: the suite never listens on other interfaces.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "etcdmember:", err)
		os.Exit(1)
	}
}

type config struct {
	name, dir, clientURL, peerURL, cluster, state, logLevel string
	tickMs, electionMs                                      uint
	noFsync, stdinEOF                                       bool
	readyTimeout                                            time.Duration
}

func parse(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("etcdmember", flag.ContinueOnError)
	fs.StringVar(&c.name, "name", "", "member name (required)")
	fs.StringVar(&c.dir, "data-dir", "", "data directory (required)")
	fs.StringVar(&c.clientURL, "client-url", "", "client URL http://127.0.0.1:PORT (required)")
	fs.StringVar(&c.peerURL, "peer-url", "", "peer URL http://127.0.0.1:PORT (required)")
	fs.StringVar(&c.cluster, "initial-cluster", "", "name=peerURL,... of every member (required)")
	fs.StringVar(&c.state, "cluster-state", "new", "initial cluster state: new or existing")
	fs.UintVar(&c.tickMs, "tick-ms", 100, "raft heartbeat interval in ms")
	fs.UintVar(&c.electionMs, "election-ms", 2000, "raft election timeout in ms (>= 5 x tick)")
	fs.StringVar(&c.logLevel, "log-level", "error", "etcd log level")
	fs.BoolVar(&c.noFsync, "no-fsync", true, "skip fsync (safe for process kills: the page cache survives them)")
	fs.BoolVar(&c.stdinEOF, "exit-on-stdin-eof", false, "exit when stdin is closed (the parent test process died)")
	fs.DurationVar(&c.readyTimeout, "ready-timeout", 2*time.Minute, "give up if not ready by then")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, errors.Newf("unexpected arguments %q", fs.Args())
	case c.name == "" || c.dir == "" || c.cluster == "":
		return c, errors.Newf("--name, --data-dir and --initial-cluster are required")
	case c.state != "new" && c.state != "existing":
		return c, errors.Newf("--cluster-state %q: want new or existing", c.state)
	case c.tickMs == 0 || c.electionMs < 5*c.tickMs:
		return c, errors.Newf("--election-ms %d must be >= 5 x --tick-ms %d", c.electionMs, c.tickMs)
	}
	for flagName, u := range map[string]string{"--client-url": c.clientURL, "--peer-url": c.peerURL} {
		if _, err := loopbackURL(u); err != nil {
			return c, errors.Newf("%s: %w", flagName, err)
		}
	}
	for _, m := range strings.Split(c.cluster, ",") {
		n, u, ok := strings.Cut(m, "=")
		if !ok || n == "" {
			return c, errors.Newf("--initial-cluster entry %q: want name=url", m)
		}
		if _, err := loopbackURL(u); err != nil {
			return c, errors.Newf("--initial-cluster entry %q: %w", m, err)
		}
	}
	return c, nil
}

func loopbackURL(raw string) (url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" {
		return url.URL{}, errors.Newf("%q: want http://127.0.0.1:PORT", raw)
	}
	host, _, err := net.SplitHostPort(u.Host)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return url.URL{}, errors.Newf("%q: host must be a loopback IP", raw)
	}
	return *u, nil
}

func run(args []string) error {
	c, err := parse(args)
	if err != nil {
		return err
	}
	cu, _ := loopbackURL(c.clientURL)
	pu, _ := loopbackURL(c.peerURL)
	ec := embed.NewConfig()
	ec.Name = c.name
	ec.Dir = c.dir
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	ec.InitialCluster = c.cluster
	ec.InitialClusterToken = "idrange-faultsuite"
	ec.ClusterState = c.state
	ec.TickMs, ec.ElectionMs = c.tickMs, c.electionMs
	ec.UnsafeNoFsync = c.noFsync
	ec.LogLevel = c.logLevel
	ec.LogOutputs = []string{"stderr"}
	// No metrics or pprof listeners: only the two loopback URLs above.
	ec.ListenMetricsUrls = nil

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if c.stdinEOF {
		go func() { // parent gone: stdin reaches EOF
			_, _ = io.Copy(io.Discard, os.Stdin)
			stop()
		}()
	}

	e, err := embed.StartEtcd(ec)
	if err != nil {
		return errors.Newf("start: %w", err)
	}
	defer e.Close()
	timer := time.NewTimer(c.readyTimeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Printf("READY %s\n", cu.String())
	case err := <-e.Err():
		return errors.Newf("failed while starting: %w", err)
	case <-timer.C:
		return errors.Newf("not ready within %v", c.readyTimeout)
	case <-ctx.Done():
		return nil
	}
	select {
	case err := <-e.Err():
		return errors.Newf("failed: %w", err)
	case <-ctx.Done():
		return nil
	}
}
