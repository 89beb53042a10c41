// Package fakeclock moves a wall clock back and forth for tests and for
// rangesvc's fault build (-tags idrange_faults), so that clock rollbacks and
// jumps can be injected without sleeping. Code that reads the wall clock
// takes a `Now func() time.Time` (time.Now by default); pass Offset.Now.
//
// Tests combine it with testing/synctest: inside a synctest bubble time.Now
// is fake and only advances when every goroutine is blocked, so a generator
// sees a frozen millisecond, and Offset.Set injects a jump.
package fakeclock

import (
	"sync/atomic"
	"time"
)

// Offset is the system clock shifted by an adjustable amount: negative moves
// it back (a rollback), positive forward (a jump). The zero value is the
// system clock. It is safe for concurrent use.
type Offset struct{ d atomic.Int64 }

// Now is time.Now shifted by the current offset.
func (o *Offset) Now() time.Time { return time.Now().Add(time.Duration(o.d.Load())) }

// Set replaces the offset.
func (o *Offset) Set(d time.Duration) { o.d.Store(int64(d)) }

// Add moves the clock by d (negative moves it back).
func (o *Offset) Add(d time.Duration) { o.d.Add(int64(d)) }

// Get returns the current offset.
func (o *Offset) Get() time.Duration { return time.Duration(o.d.Load()) }
