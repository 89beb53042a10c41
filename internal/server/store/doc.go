// Package store is the range service's grant loop: worker-code leases,
// fencing tokens and per-code high-water marks, and the rule
// (segment.Policy) that turns them into blocks, over a small Storage
// interface of versioned bytes. etcdstore implements Storage on etcd (one
// transaction per grant, or one per group of grants); memstore in memory,
// for tests and the client's fake service; storetest is the conformance
// suite both pass. The Store is the one place the grant rule runs, for
// both.
//
// Files: store.go (the Store, its view cache and turns), config.go,
// acquire.go (leases and the per-identity cap), lease.go (fence, Renew,
// Release), allocate.go (the grant loop), batch.go (group commit),
// floor.go (the replica's own check that a high-water mark only grows),
// operator.go (snapshots, lease lists, Fence for operators), encoding.go
// (the stored values), storage.go (the interface), observer.go (metric
// events).
//
// Caller identities bind leases to the authenticated caller that acquired
// them. The range service verifies the caller's certificate (mutual TLS),
// turns it into an identity string ("uri:...", "dns:..." or "cn:...") and
// passes it to the Store in the call's context (internal/server/authz,
// WithIdentity). The Store then:
//
//   - records it in the owner record at Acquire (OwnerRecord.Identity,
//     record version 2), and refuses an identity already holding
//     Config.MaxCodesPerIdentity codes with ErrCodeCap;
//   - refuses Renew, Release and Allocate with ErrPermissionDenied unless the
//     caller's identity equals the one recorded for the lease (see fence:
//     the identity is checked before anything about the lease is revealed).
//
// The empty identity is "no verified caller" (no mutual TLS): records are
// written as version 1, exactly as before identities existed, and no cap
// applies. The comparison is exact, so an anonymous caller cannot act on a
// lease bound to an identity, nor an identified caller on an anonymous one.
package store
