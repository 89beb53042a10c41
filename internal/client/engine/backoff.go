package engine

import (
	"math/rand/v2"
	"time"
)

// backoff is exponential backoff with full jitter in [d/2, d], between
// tuning BackoffBase and tuning BackoffMax. Not safe for concurrent use:
// each loop owns one.
type backoff struct {
	base, max, cur time.Duration
}

func (c *lane) newBackoff() *backoff {
	return &backoff{base: c.cfg.Tuning.BackoffBase, max: c.cfg.Tuning.BackoffMax}
}

// next returns the delay before the next attempt and doubles the following.
func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.base
	}
	d := b.cur
	b.cur = min(b.cur*2, b.max)
	return d/2 + rand.N(d/2+1)
}

func (b *backoff) reset() { b.cur = 0 }
