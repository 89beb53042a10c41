// Package depcheck holds no code: its test guards the dependency sets of the
// public libraries (docs/design.md, "Dependencies"). A user who imports
// rangeclient gets gRPC, protobuf and the Prometheus client, and nothing of
// etcd, zap, sentry, gogo or cockroachdb; snowflake is standard library
// only, like the generators it is compared with; the segment domain package
// has no etcd and no cockroachdb; neither rangeclient nor the binaries link
// the Prometheus server module, whose PromQL parser only tests use. Run it
// alone with
//
//	go test -count=1 -v ./internal/tools/depcheck/
package depcheck
