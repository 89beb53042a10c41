// Package carve is the request for a shared run (the AllocateShared RPC)
// that the range service carves out of the blocks its own minter holds, and
// its rules: the service builds a Request from the RPC's fields and its
// bounds, and the minter (an internal/client/engine.Engine: its Carve
// method) takes the run.
//
// The minter behind MintBatch and Next holds a worker code and blocks
// whose high-water mark is committed. A shared run is a stretch of the
// current block taken with the same atomic cursor that Next uses, so every
// position is handed out once, by the minter or in one run, and lies below
// the code's committed mark (docs/design.md, "The shared path"). The
// package sits between the client and the server groups, so that neither
// imports the other's internals for it.
package carve

import (
	"errors"
	"fmt"
	"time"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Request is one shared run to carve.
type Request struct {
	// N is the most positions wanted, 1..segment.MaxShared; the run may be
	// shorter (it ends with the block it is carved from).
	N int64
	// After: the run's first ID is greater than After.
	After snowflake.ID
	// MaxLead bounds how far ahead of the service clock the run may start:
	// when After (a client whose last run came from a code further ahead)
	// or the minter's own cursor (its code mints faster than the clock)
	// would start it further ahead, the carve is refused with a
	// *segment.Backpressure holding the time until it fits.
	MaxLead time.Duration
	// ValidFor is the run's validity counted from the start of its first
	// millisecond: a client that stops by then hands out no ID more than
	// ValidFor behind the service's clock.
	ValidFor time.Duration
	// MinLife: a run whose validity would end sooner than this after the
	// service time of the carve (the minter's lease is near its safety
	// deadline) is refused instead.
	MinLife time.Duration
}

// Validate reports the first field of r out of range.
func (r Request) Validate() error {
	switch {
	case r.N < 1 || r.N > segment.MaxShared:
		return fmt.Errorf("carve: count %d not in 1..%d: %w", r.N, segment.MaxShared, segment.ErrInvalid)
	case r.After < 0:
		return fmt.Errorf("carve: after ID %d is negative: %w", r.After, segment.ErrInvalid)
	case r.MaxLead < 0 || r.ValidFor <= 0 || r.MinLife < 0 || r.MinLife >= r.ValidFor:
		return fmt.Errorf("carve: lead %v, validity %v, least life %v out of range: %w", r.MaxLead, r.ValidFor, r.MinLife, segment.ErrInvalid)
	}
	return nil
}

// ErrNotCarver: the minter cannot carve shared runs (an engine that is on
// the shared path itself, holding no code of its own).
var ErrNotCarver = errors.New("carve: the minter cannot carve shared runs")
