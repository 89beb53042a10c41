// Package buildinfo says which build of idrange is running: the module
// version, the VCS revision it was built from and the Go version, as
// recorded by the go command (runtime/debug.ReadBuildInfo). `rangesvc
// version` prints it and `rangesvc serve` exports it as the
// idrange_build_info metric, so an operator can tell from a scrape which
// binary each replica runs.
//
// A build inside the git checkout (go build ./cmd/rangesvc) records the
// revision, its commit time and whether the tree had local changes; the
// module version is then what the go command derives from the VCS (a
// pseudo-version, "+dirty" with local changes) or "(devel)". Release builds
// set the version explicitly:
//
//	go build -ldflags "-X github.com/idrange/idrange/internal/server/buildinfo.Version=v1.2.3" ./cmd/rangesvc
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Version, when set at link time with -ldflags -X (see the package doc),
// overrides the module version the go command recorded. Release builds set
// it; a tag-less checkout build leaves it empty.
var Version string

// Unknown stands for a field the binary does not record (a build outside a
// VCS checkout, or with -buildvcs=false).
const Unknown = "unknown"

// Info is what a binary knows about its own build.
type Info struct {
	// Version is Version if set at link time, else the main module's
	// version as the go command recorded it ("(devel)", a pseudo-version,
	// or a tag), else Unknown.
	Version string `json:"version"`
	// Revision is the VCS commit (vcs.revision), or Unknown.
	Revision string `json:"revision"`
	// Modified reports that the tree had uncommitted changes (vcs.modified).
	Modified bool `json:"modified"`
	// Time is the commit time (vcs.time, RFC 3339), or Unknown.
	Time string `json:"time"`
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string `json:"go"`
}

// Read returns the running binary's build information.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	return fromBuildInfo(bi, ok, Version)
}

// fromBuildInfo is Read's work on given inputs (a test seam).
func fromBuildInfo(bi *debug.BuildInfo, ok bool, override string) Info {
	in := Info{Version: Unknown, Revision: Unknown, Time: Unknown, GoVersion: runtime.Version()}
	if ok && bi != nil {
		if bi.Main.Version != "" {
			in.Version = bi.Main.Version
		}
		if bi.GoVersion != "" {
			in.GoVersion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				in.Revision = s.Value
			case "vcs.time":
				in.Time = s.Value
			case "vcs.modified":
				in.Modified, _ = strconv.ParseBool(s.Value)
			}
		}
	}
	if override != "" {
		in.Version = override
	}
	return in
}

// NewCollector is the idrange_build_info gauge: always 1, labelled with the
// build's version, revision and Go version (the Prometheus *_build_info
// convention, joinable onto any other series of the same target).
func NewCollector(in Info) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "idrange",
		Name:      "build_info",
		Help:      "A metric with a constant 1 labelled by the build's module version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{
			"version":   in.Version,
			"revision":  in.Revision,
			"goversion": in.GoVersion,
		},
	})
	g.Set(1)
	return g
}
