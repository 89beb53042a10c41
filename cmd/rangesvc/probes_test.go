package main

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/idrange/idrange/internal/server/embedetcd/embedetcdtest"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
	"github.com/idrange/idrange/internal/testing/testenv"
)

// waitProbe polls path until it answers code (bounded), and returns the
// body of that answer.
func waitProbe(t *testing.T, p *testenv.Process, path string, code int, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got, body := p.Probe(t, path)
		if got == code {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s answered %d %q for %v, want %d", path, got, body, timeout, code)
		}
		time.Sleep(50 * time.Millisecond) // polling an HTTP endpoint; no event to wait on
	}
}

func expectProbe(t *testing.T, p *testenv.Process, path string, code int, bodyPart string) {
	t.Helper()
	got, body := p.Probe(t, path)
	if got != code || !strings.Contains(body, bodyPart) {
		t.Fatalf("%s = %d %q, want %d containing %q", path, got, body, code, bodyPart)
	}
}

// reflectedServices lists the services of the server at addr through gRPC
// server reflection, as grpcurl's "list" does.
func reflectedServices(t *testing.T, ctx context.Context, addr string) []string {
	t.Helper()
	stream, err := reflectionpb.NewServerReflectionClient(regiontest.Dial(t, addr)).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.CloseSend()
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("reflection: %v", err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	return names
}

// The probes of a real replica on an external etcd: /livez answers 200
// throughout, also while etcd is down; /readyz (and its old name /healthz)
// and gRPC health turn NOT_SERVING while etcd is down, /readyz naming the
// reason, and come back with etcd. Reflection lists the services, and
// /metrics carries idrange_build_info.
func TestProbesEtcdDownSubprocess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the rangesvc binary")
	}
	testenv.Binary(t) // build first: a cold build must not eat the test's deadline
	etcd := embedetcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p := testenv.StartServe(t, testenv.ServeConfig{Region: 2, Etcd: etcd.Endpoints(),
		Args: []string{"--etcd-timeout", "1s"}})

	svcs := reflectedServices(t, ctx, p.GRPCAddr)
	t.Logf("reflection lists %q", svcs)
	for _, want := range []string{"idrange.v1.RangeService", "grpc.health.v1.Health"} {
		if !slices.Contains(svcs, want) {
			t.Errorf("reflection lists %q, want %s among them", svcs, want)
		}
	}
	if m := p.Scrape(t); !strings.Contains(m, `idrange_build_info{goversion="go`) {
		t.Errorf("/metrics lacks idrange_build_info")
	}

	hc := healthpb.NewHealthClient(regiontest.Dial(t, p.GRPCAddr))
	waitHealth(t, ctx, hc, healthpb.HealthCheckResponse_SERVING)
	expectProbe(t, p, "/livez", http.StatusOK, "ok")
	expectProbe(t, p, "/readyz", http.StatusOK, "SERVING")
	expectProbe(t, p, "/healthz", http.StatusOK, "SERVING")

	etcd.Stop()
	body := waitProbe(t, p, "/readyz", http.StatusServiceUnavailable, 30*time.Second)
	if !strings.Contains(body, "NOT_SERVING: store check failed") {
		t.Errorf("/readyz body %q does not name the reason", body)
	}
	waitHealth(t, ctx, hc, healthpb.HealthCheckResponse_NOT_SERVING)
	expectProbe(t, p, "/healthz", http.StatusServiceUnavailable, "store check failed")
	for range 5 { // several store checks (1 s each) later, still alive
		expectProbe(t, p, "/livez", http.StatusOK, "ok")
		time.Sleep(300 * time.Millisecond) // spacing the probes over a few store checks
	}

	sctx, scancel := context.WithTimeout(ctx, 60*time.Second)
	defer scancel()
	if err := etcd.Start(sctx); err != nil {
		t.Fatalf("restart etcd: %v", err)
	}
	waitProbe(t, p, "/readyz", http.StatusOK, 30*time.Second)
	waitHealth(t, ctx, hc, healthpb.HealthCheckResponse_SERVING)

	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\nstderr:\n%s", err, p.Stderr())
	}
}
