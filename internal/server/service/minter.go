package service

import (
	"context"
	"sync"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/snowflake"
)

// MinterCloser is a Minter that holds resources (a lease) until closed;
// *rangeclient.Client is one.
type MinterCloser interface {
	Minter
	Close() error
}

// ErrMinterClosed is returned by LazyMinter.AppendN after Close.
var ErrMinterClosed = errors.New("service: minter closed")

// LazyMinter opens its MinterCloser on first use, so a replica takes a
// worker code for MintBatch and Next only if somebody calls them (or, with
// the shared path on, at start: Open). A failed open is returned to that
// caller and retried by the next one.
type LazyMinter struct {
	open func(ctx context.Context) (MinterCloser, error)

	mu     sync.Mutex
	m      MinterCloser
	closed bool
}

// NewLazyMinter returns a LazyMinter that calls open on first use.
func NewLazyMinter(open func(ctx context.Context) (MinterCloser, error)) *LazyMinter {
	return &LazyMinter{open: open}
}

// AppendN mints n IDs onto dst, opening the minter first if needed.
func (l *LazyMinter) AppendN(ctx context.Context, dst []snowflake.ID, n int) ([]snowflake.ID, error) {
	m, err := l.get(ctx)
	if err != nil {
		return dst, err
	}
	return m.AppendN(ctx, dst, n)
}

func (l *LazyMinter) get(ctx context.Context) (MinterCloser, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return nil, ErrMinterClosed
	case l.m != nil:
		return l.m, nil
	}
	m, err := l.open(ctx)
	if err != nil {
		return nil, errors.Newf("service: open minter: %w", err)
	}
	l.m = m
	return m, nil
}

// Open opens the minter now if it is not open yet: a replica serving the
// shared path does so at start, so it holds a code to carve from before
// clients can take every code of the region.
func (l *LazyMinter) Open(ctx context.Context) error {
	_, err := l.get(ctx)
	return err
}

// opened reports whether the minter was opened (and not closed).
func (l *LazyMinter) opened() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m != nil && !l.closed
}

// Close closes the minter if it was opened; later calls fail.
func (l *LazyMinter) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.m == nil {
		return nil
	}
	return l.m.Close()
}
