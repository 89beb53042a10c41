package benchrun

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/testing/testenv"
)

// procCPU is a running process's CPU time (user + system) from
// /proc/<pid>/stat; ok is false where there is no /proc.
func procCPU(t *testing.T, pid int) (cpu time.Duration, ok bool) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// Fields after the command name (which may hold spaces) start at
	// field 3, state; utime and stime are fields 14 and 15, in clock
	// ticks (100 per second on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, true
}

// The hog child burns CPU while it runs and exits on its own (status 0)
// when its stdin closes, as it does when the bench ends or dies.
func TestCPUHogRunsAndStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := startHog(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer h.stop()
	pid := h.cmd.Process.Pid
	const want = 150 * time.Millisecond
	// Poll the child's CPU time until it burnt want (a second or so of
	// wall time even on a busy machine), bounded.
	deadline := time.Now().Add(30 * time.Second)
	for {
		cpu, ok := procCPU(t, pid)
		if !ok {
			testenv.Missing(t, "/proc/<pid>/stat", "the test reads the hog child's CPU time from it while the child runs (mount procfs)")
		}
		if cpu >= want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hog child burnt only %v of CPU in 30s", cpu)
		}
		time.Sleep(20 * time.Millisecond) // polling another process: no event to wait on
	}
	stopped := time.Now()
	res := h.stop()
	if d := time.Since(stopped); d >= hogStopGrace {
		t.Errorf("stop took %v: the child did not exit on stdin EOF", d)
	}
	if res.Problem != "" || !h.cmd.ProcessState.Success() {
		t.Errorf("stop: problem %q, state %v", res.Problem, h.cmd.ProcessState)
	}
	if cpu := h.cmd.ProcessState.UserTime() + h.cmd.ProcessState.SystemTime(); cpu < want || res.CPUCores <= 0 {
		t.Errorf("child CPU %v (%.2f cores), want at least %v", cpu, res.CPUCores, want)
	}
	if _, ok := procCPU(t, pid); ok {
		t.Errorf("process %d still exists after stop", pid)
	}
}

// A child that dies before the end of the run is reported, not hidden.
func TestCPUHogEarlyExitIsReported(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := startHog(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-h.done
	res := h.stop()
	if !strings.Contains(res.Problem, "exited before the end of the run") || !strings.Contains(res.Problem, "killed") {
		t.Errorf("problem %q", res.Problem)
	}
}

// A small fleet under a 1-core hog: the report records the hog, the hog
// burnt CPU, and every ID still verifies.
func TestSmallFleetUnderCPUHog(t *testing.T) {
	env := sharedEnv.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := smallConfig()
	cfg.CPUHog = 1
	rep, err := RunOn(ctx, env, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.VerifyErr(); err != nil {
		t.Fatal(err)
	}
	if rep.Fleet.CPUHog != 1 || rep.HogCPUCores <= 0.05 || rep.HogProblem != "" {
		t.Errorf("fleet %+v, hog CPU %.2f cores, problem %q", rep.Fleet, rep.HogCPUCores, rep.HogProblem)
	}
	var md strings.Builder
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "CPU hog: 1 busy core(s) in a child process") {
		t.Errorf("markdown does not name the hog:\n%s", md.String())
	}
	js := reportJSON(t, rep)
	if !strings.Contains(js, `"cpu_hog": 1`) {
		t.Errorf("JSON lacks cpu_hog: %s", js)
	}
}

func reportJSON(t *testing.T, rep *Report) string {
	t.Helper()
	var b strings.Builder
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
