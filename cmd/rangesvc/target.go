package main

import (
	"flag"

	"github.com/idrange/idrange/internal/server/cli"
)

// targetFlag registers --target, the replicas a client command talks to:
// host:port[,host:port...], and the flag may be repeated.
func targetFlag(fs *flag.FlagSet, dst *[]string) {
	fs.Func("target", "rangesvc gRPC address(es) host:port[,host:port...] (required)", func(s string) error {
		*dst = append(*dst, cli.SplitList(s)...)
		return nil
	})
}

// checkTargets is --target's validation: at least one, each host:port.
func checkTargets(targets []string) error {
	if len(targets) == 0 {
		return cli.Usagef("--target is required")
	}
	for _, t := range targets {
		if err := checkEndpoint(t); err != nil {
			return cli.Usagef("--target %v", err)
		}
	}
	return nil
}
