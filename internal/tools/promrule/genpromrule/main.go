// Command genpromrule writes deploy/kubernetes/prometheusrule.yaml from
// deploy/prometheus/idrange.rules.yml (package promrule). Run it through
// `go generate ./internal/tools/promrule`.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/cockroachdb/errors"
	"github.com/idrange/idrange/internal/tools/promrule"
)

func main() {
	in := flag.String("in", "", "Prometheus rules file to read")
	out := flag.String("out", "", "PrometheusRule file to write")
	flag.Parse()
	if *in == "" || *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: genpromrule -in RULES.yml -out PROMETHEUSRULE.yaml")
		os.Exit(2)
	}
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "genpromrule:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	data, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	gen, err := promrule.Generate(data)
	if err != nil {
		return errors.Newf("%s: %w", in, err)
	}
	return os.WriteFile(out, gen, 0o644)
}
