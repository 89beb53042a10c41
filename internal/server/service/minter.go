package service

import (
	"context"

	"github.com/idrange/idrange/internal/server/carve"
	"github.com/idrange/idrange/segment"
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

// codeCounter is a Minter that says how many worker codes it holds.
type codeCounter interface {
	Codes() int
}
