// Package idrangev1 holds the gRPC API of the range service, generated from
// range.proto (RangeService, for ID clients) and admin.proto (AdminService,
// for operators: rangesvc admin). The generated files are committed:
// building and testing need no protoc.
//
// To regenerate after editing a .proto file, with the same generator versions
// as the headers of range.pb.go and range_grpc.pb.go (so the diff shows only
// the change):
//
//	apt-get install -y protobuf-compiler    # Debian 12: protoc 3.21.12
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.0
//	go generate ./api/...                   # with $(go env GOPATH)/bin on PATH
//	goimports -w api/idrangev1/*.pb.go      # the committed import grouping
//
// Regenerating the unchanged range.proto with these versions (and
// goimports) reproduces the committed files byte for byte.
//
// range.proto's HTTP bindings (google.api.http, read by the HTTP/JSON
// transcoder of rangesvc serve --http) import google/api/annotations.proto
// from ../third_party: a subset of the public definitions, enough for protoc,
// with the same field numbers; at run time the generated code links the full
// ones from google.golang.org/genproto/googleapis/api/annotations. The same
// holds for google/rpc/status.proto (AllocateSharedBatch's per-request
// status), linked from google.golang.org/genproto/googleapis/rpc/status.
package idrangev1

//go:generate protoc -I . -I ../third_party --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative range.proto admin.proto
