package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestFromBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{
		GoVersion: "go1.99.1",
		Main:      debug.Module{Path: "github.com/idrange/idrange", Version: "(devel)"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2026-12-03T06:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	got := fromBuildInfo(bi, true, "")
	want := Info{Version: "(devel)", Revision: "0123456789abcdef0123456789abcdef01234567",
		Modified: true, Time: "2026-12-03T06:00:00Z", GoVersion: "go1.99.1"}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if got := fromBuildInfo(bi, true, "v1.2.3"); got.Version != "v1.2.3" || got.Revision != want.Revision {
		t.Fatalf("override: got %+v", got)
	}
	none := fromBuildInfo(nil, false, "")
	if none.Version != Unknown || none.Revision != Unknown || none.Time != Unknown || none.GoVersion != runtime.Version() {
		t.Fatalf("no build info: got %+v", none)
	}
}

func TestCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(Info{Version: "v1.2.3", Revision: "abc", GoVersion: "go1.99.1"}))
	const want = `# HELP idrange_build_info A metric with a constant 1 labelled by the build's module version, VCS revision and Go version.
# TYPE idrange_build_info gauge
idrange_build_info{goversion="go1.99.1",revision="abc",version="v1.2.3"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idrange_build_info"); err != nil {
		t.Fatal(err)
	}
}
