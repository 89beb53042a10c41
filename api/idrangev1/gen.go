// Package idrangev1 holds the gRPC API of the range service, generated from
// range.proto. Regenerate with `go generate ./api/...` (needs protoc from
// Debian's protobuf-compiler plus protoc-gen-go and protoc-gen-go-grpc).
package idrangev1

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative range.proto
