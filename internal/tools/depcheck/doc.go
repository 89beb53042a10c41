// Package depcheck holds no code: its test guards the dependency sets of the
// public libraries (docs/design.md, "Dependencies"). A user who imports
// rangeclient gets gRPC, protobuf and the Prometheus client, and nothing of
// etcd, zap, sentry, gogo or cockroachdb, and the same holds for its test
// double rangeclient/rangeclienttest (the grant loop and its in-memory
// storage run on the standard library's errors) and for the client engine
// under rangeclient, which also imports nothing of internal/server/;
// snowflake is standard library
// only, like the generators it is compared with, and so is publicid (the
// public-ID tokens); the segment domain package
// has no etcd and no cockroachdb; neither rangeclient nor the binaries link
// the Prometheus server module, whose PromQL parser only tests use; the
// server binary (cmd/rangesvc, its fault build too) links neither the
// testing package, nor bench or compare, nor the test harnesses
// (internal/testing/) or the fault suite (internal/faultsuite/). Run it
// alone with
//
//	go test -count=1 -v ./internal/tools/depcheck/
package depcheck
