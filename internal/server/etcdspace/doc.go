// Package etcdspace keeps a range service's etcd from filling up: a
// Compactor that compacts etcd's history (one replica at a time, elected
// through etcd) and a Monitor that exports the backend size, the quota and
// the NOSPACE alarm, and turns the alarm into a health error.
//
// Why it is needed: every block grant writes a new revision of a
// high-water-mark key, and etcd keeps every revision (on disk and in its
// in-memory index) until history is compacted. Without compaction a region
// at fleet load reaches etcd's backend quota in hours; etcd then raises the
// NOSPACE alarm and refuses every write, so every grant fails.
//
// Usage (internal/server/region wires both into every replica):
//
//	c, _ := etcdspace.NewCompactor(etcdspace.CompactorConfig{Etcd: cli, Key: prefix + "compactor"})
//	m, _ := etcdspace.NewMonitor(etcdspace.MonitorConfig{Etcd: cli})
//	go c.Run(ctx)
//	go m.Run(ctx)
//	... health check: m.Err() is non-nil (errors.Is ErrNoSpace) while NOSPACE is raised
//
// docs/operations/etcd-space.md ("History compaction and space") is the operator's
// side: flags, metrics, and the recovery from NOSPACE.
package etcdspace
