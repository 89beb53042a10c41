package benchrun

import (
	"bytes"
	"io"
	"runtime/pprof"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/pprof/profile"
)

// Every goroutine the bench starts runs under a role label (roleLabel):
// etcd, replica (the range services, their gRPC servers and minters),
// client (the rangeclients and their connections) and pacer (the workers'
// loops, which call Next and keep every ID). The CPU profile of the paced
// run, always taken, is summed by that label, so the report can say what
// the range service itself cost while this process also ran its load.

// roleProfile is the CPU profile of the paced run, kept in memory and
// copied to Config.CPUProfile when one is asked for.
type roleProfile struct {
	buf bytes.Buffer
}

// startRoleProfile starts the CPU profile; extra (nil: none) receives a
// copy. It returns nil, and no error, when a profile is already running
// (go test -cpuprofile): the report then has no CPU by role.
func startRoleProfile(extra io.Writer) (*roleProfile, error) {
	p := &roleProfile{}
	var w io.Writer = &p.buf
	if extra != nil {
		w = io.MultiWriter(&p.buf, extra)
	}
	if err := pprof.StartCPUProfile(w); err != nil {
		if extra != nil {
			return nil, errors.Wrap(err, "bench: CPU profile")
		}
		return nil, nil
	}
	return p, nil
}

// stop ends the profile and returns the cores each role used over it
// ("other": unlabelled goroutines, the Go runtime's own included).
func (p *roleProfile) stop() (map[string]float64, error) {
	pprof.StopCPUProfile()
	prof, err := profile.Parse(&p.buf)
	if err != nil {
		return nil, errors.Wrap(err, "bench: read the CPU profile")
	}
	return cpuByRole(prof)
}

// cpuByRole sums prof's CPU time by role label, in cores over the
// profile's duration.
func cpuByRole(prof *profile.Profile) (map[string]float64, error) {
	idx := -1
	for i, st := range prof.SampleType {
		if st.Type == "cpu" && st.Unit == "nanoseconds" {
			idx = i
		}
	}
	if idx < 0 || prof.DurationNanos <= 0 {
		return nil, errors.Newf("bench: the CPU profile has no cpu/nanoseconds samples or no duration")
	}
	out := map[string]float64{}
	d := time.Duration(prof.DurationNanos).Seconds()
	for _, s := range prof.Sample {
		role := "other"
		if v := s.Label["role"]; len(v) > 0 {
			role = v[0]
		}
		out[role] += float64(s.Value[idx]) / 1e9 / d
	}
	return out, nil
}
