package mintpool

import (
	"context"

	"github.com/idrange/idrange/internal/server/carve"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Closer is a minter of one code that package carve carves from (a
// *rangeclient.Client with Codes 1).
type Closer interface {
	AppendN(ctx context.Context, dst []snowflake.ID, n int) ([]snowflake.ID, error)
	Close() error
}

// Carving is m as a Minter: it carves with carve.Carve.
func Carving(m Closer) Minter { return carving{m} }

type carving struct{ Closer }

func (c carving) Carve(ctx context.Context, r carve.Request) (segment.Block, error) {
	return carve.Carve(ctx, c.Closer, r)
}
