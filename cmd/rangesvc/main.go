// Command rangesvc is idrange's server binary.
//
//	rangesvc serve   --region N --listen ADDR --metrics ADDR [--data-dir DIR | --etcd EPS]
//	rangesvc mint    --target ADDR -n N
//	rangesvc admin   status|leases|fence|alarm --target ADDR [-o table|json]
//	rangesvc decode  ID...
//	rangesvc token   keygen|promote|encode|decode ...  (public-ID tokens)
//	rangesvc compare [flags]   (runs rangesvc-bench compare)
//	rangesvc bench   [flags]   (runs rangesvc-bench bench)
//	rangesvc version [-o json]
//
// The measurement commands live in the rangesvc-bench binary, so that the
// server does not link the plotting and comparison code; rangesvc runs
// rangesvc-bench when it is installed next to it or on $PATH.
//
// Exit codes: 0 success, 1 runtime failure, 2 bad usage. Errors go to
// stderr; stdout carries only the command's output.
package main

import (
	"context"
	"io"

	"github.com/idrange/idrange/internal/server/cli"
)

// prog is the binary's name in messages.
const prog = "rangesvc"

// commands is the subcommand table; each lives in its own file.
var commands = map[string]cli.Command{
	"decode":  {Summary: "print the fields of IDs", Run: runDecode},
	"serve":   {Summary: "run the regional range service (gRPC) on embedded or external etcd", Run: runServe},
	"mint":    {Summary: "mint N IDs through a range service and print them", Run: runMint},
	"admin":   {Summary: "operator view of a region: status, leases, fence, alarm (through the service)", Run: runAdmin},
	"compare": {Summary: "run one workload through each ID strategy and print a table (rangesvc-bench)", Run: forward("compare")},
	"bench":   {Summary: "fleet load test: regions x workers at a target rate (rangesvc-bench)", Run: forward("bench")},
	"version": {Summary: "print the build: module version, VCS revision, Go version", Run: runVersion},
	"token":   {Summary: "public-ID tokens: key files (keygen, promote), encode and decode IDs", Run: runToken},
}

func main() {
	installGRPCLogger()
	cli.Main(prog, commands)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Run(ctx, prog, commands, args, stdout, stderr)
}
