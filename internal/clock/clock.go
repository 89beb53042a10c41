// Package clock is the time source idrange injects into anything that reads
// the wall clock, so rollbacks and jumps can be tested without sleeping.
//
// Tests combine Offset with testing/synctest: inside a synctest bubble
// time.Now is fake and only advances when every goroutine is blocked, so a
// generator sees a frozen millisecond, and Offset.Set injects a jump.
package clock

import (
	"context"
	"sync/atomic"
	"time"
)

// Clock returns the current time. Implementations must be safe for
// concurrent use.
type Clock interface {
	Now() time.Time
}

// System is the process's real clock.
type System struct{}

// Now is time.Now.
func (System) Now() time.Time { return time.Now() }

// Offset is the system clock shifted by an adjustable amount, to inject
// rollbacks (negative) and jumps (positive). The zero value is the system
// clock.
type Offset struct{ d atomic.Int64 }

// Now is time.Now shifted by the current offset.
func (o *Offset) Now() time.Time { return time.Now().Add(time.Duration(o.d.Load())) }

// Set replaces the offset.
func (o *Offset) Set(d time.Duration) { o.d.Store(int64(d)) }

// Add moves the clock by d (negative moves it back).
func (o *Offset) Add(d time.Duration) { o.d.Add(int64(d)) }

// Get returns the current offset.
func (o *Offset) Get() time.Duration { return time.Duration(o.d.Load()) }

// Sleep waits for d or until ctx is done, whichever is first, and returns
// ctx.Err() in the second case.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
