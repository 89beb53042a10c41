// Package python_test runs the Python example (mint.py) against two real
// rangesvc replicas of one region.
package python_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/testing/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

// mint.py mints from two replicas sharing one etcd and checks every ID is
// unique and decodes to the region; here the test also shows that mint.py
// fails (exit 1) when the region it is told does not match.
func TestPythonExample(t *testing.T) {
	py := testenv.LookTool(t, "python3", "the Python example is run with it; install it (Debian: apt-get install python3; .ci/run does)")
	const region = 1
	a := testenv.StartServe(t, testenv.ServeConfig{Region: region})
	etcd := a.EmbeddedEtcd(t)
	b := testenv.StartServe(t, testenv.ServeConfig{Region: region, Etcd: []string{etcd.Endpoint}, Args: etcd.Flags()})
	urls := []string{"http://" + a.HTTPAddr, "http://" + b.HTTPAddr}

	out, err := runPy(t, py, append([]string{"--region", fmt.Sprint(region), "--count", "5000", "--batch", "1000"}, urls...)...)
	if err != nil {
		t.Fatalf("mint.py: %v\n%s", err, out)
	}
	if !strings.Contains(out, "10000 unique IDs of region 1 from 2 replica(s)") {
		t.Fatalf("mint.py printed %q", out)
	}
	// The two replicas' minters hold distinct worker codes.
	if !regexp.MustCompile(`worker codes \[\d+, \d+\]`).MatchString(out) {
		t.Errorf("want two worker codes in %q", out)
	}
	out, err = runPy(t, py, "--region", "3", "--count", "10", urls[0])
	if err == nil || !strings.Contains(out, "has region 1, want 3") {
		t.Fatalf("mint.py with the wrong region: %v, %q; want exit 1 naming the region", err, out)
	}
}

func runPy(t *testing.T, py string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, append([]string{"mint.py"}, args...)...).CombinedOutput()
	return string(out), err
}
