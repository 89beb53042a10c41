// This file describes the host a measurement ran on, so every table
// compare and bench print says what produced it (a figure without its
// machine is not reproducible).

package measure

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strings"
)

// Machine is the part of the host that explains a throughput figure.
type Machine struct {
	CPUModel   string `json:"cpu_model"`
	NumCPU     int    `json:"num_cpu"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	GOOS       string `json:"goos"`
	GOARCH     string `json:"goarch"`
	GoVersion  string `json:"go_version"`
	// LoadAvg is /proc/loadavg's 1-minute figure when CurrentMachine was called:
	// above NumCPU means other work competed for the CPUs.
	LoadAvg string `json:"load_avg_1m"`
}

// CurrentMachine reads the host's Machine. The CPU model comes from /proc/cpuinfo
// ("unknown" where that file does not exist).
func CurrentMachine() Machine {
	return Machine{
		CPUModel:   cpuModel(),
		NumCPU:     runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		GOOS:       runtime.GOOS,
		GOARCH:     runtime.GOARCH,
		GoVersion:  runtime.Version(),
		LoadAvg:    loadAvg(),
	}
}

// String is a one-line description for a report header.
func (i Machine) String() string {
	return fmt.Sprintf("%s, %d CPU (GOMAXPROCS %d), %s/%s, %s, load average %s at start",
		i.CPUModel, i.NumCPU, i.GOMAXPROCS, i.GOOS, i.GOARCH, i.GoVersion, i.LoadAvg)
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "unknown"
	}
	return f[0]
}
