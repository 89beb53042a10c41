package service

import (
	"context"
	"time"

	"github.com/idrange/idrange/internal/carve"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// MinterCloser is a Minter that holds resources (a lease) until closed;
// *rangeclient.Client is one.
type MinterCloser interface {
	Minter
	Close() error
}

// Carver is a Minter the shared path carves runs from: the replica's
// minter pool (internal/server/mintpool), which keeps every code within
// its lead bound and answers *segment.Backpressure beyond it. A service
// whose Minter is not a Carver answers AllocateShared Unimplemented.
type Carver interface {
	Minter
	Carve(ctx context.Context, r carve.Request) (segment.Block, error)
}

// leadMinter is a Minter that takes a lead bound per call: the minter
// pool, whose callers above their fair share get a lower one.
type leadMinter interface {
	AppendNWithin(ctx context.Context, dst []snowflake.ID, n int, maxLead time.Duration) ([]snowflake.ID, error)
}

// codeCounter is a Minter that says how many worker codes it holds.
type codeCounter interface {
	Codes() int
}
