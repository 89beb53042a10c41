package history

// The rules on blocks and shared runs as the store granted them: disjoint
// per code across processes, each equal to (a block) or inside (a run) one
// committed step of the code's high-water mark.

import (
	"fmt"
	"sort"

	"github.com/idrange/idrange/internal/testing/overlap"
)

// checkBlocks checks that blocks and shared runs of one code, from every
// process, never overlap, and counts the positions and blocks (runs) that
// were never used.
func (c *checker) checkBlocks() {
	spans := make([]overlap.Span, 0, len(c.blocks)+len(c.shared))
	names := make([]string, 0, cap(spans))
	for _, b := range c.blocks {
		spans = append(spans, overlap.Span{Region: b.Region, Worker: b.Worker, Lo: b.Lo, Hi: b.Hi})
		names = append(names, fmt.Sprintf("%s's block [%d,%d)", b.proc.Name, b.Lo, b.Hi))
	}
	for _, r := range c.shared {
		spans = append(spans, overlap.Span{Region: r.Region, Worker: r.Worker, Lo: r.Lo, Hi: r.Hi})
		names = append(names, fmt.Sprintf("%s's shared run [%d,%d)", r.proc.Name, r.Lo, r.Hi))
	}
	for _, o := range overlap.Find(spans) {
		b := spans[o.Later]
		c.rep.BlockOverlaps++
		c.example("overlap", "%v: %s overlaps %s", codeKey{b.Region, b.Worker}, names[o.Later], names[o.Earlier])
	}
	for _, b := range c.blocks {
		c.rep.GapPositions += b.Len() - b.minted
		if b.minted == 0 {
			c.rep.UnusedBlocks++
		}
	}
	for _, r := range c.shared {
		c.rep.GapPositions += r.Len() - r.minted
		if r.minted == 0 {
			c.rep.UnusedBlocks++
		}
	}
}

// checkHWM matches the received blocks against etcd's HWM steps.
func (c *checker) checkHWM() {
	first := c.hwmIndex()
	received := map[codeKey]map[int]bool{}
	for k, bs := range c.allBlocks {
		for _, b := range bs {
			if i, ok := c.hwmStep(k, b, first[k]); ok {
				if received[k] == nil {
					received[k] = map[int]bool{}
				}
				received[k][i] = true
			}
		}
	}
	for _, r := range c.shared {
		k := codeKey{r.Region, r.Worker}
		if i, ok := c.sharedStep(k, r); ok {
			if received[k] == nil {
				received[k] = map[int]bool{}
			}
			received[k][i] = true // by the replica's minter it was carved from
		}
	}
	for w, vals := range c.cfg.HWM {
		k := codeKey{c.cfg.Region, w}
		var prev int64
		for i, v := range vals {
			if v > prev {
				c.rep.HWMSteps++
				if !received[k][i] {
					c.rep.BurnedGrants++
					if len(c.owners[k]) > 0 {
						c.rep.BurnedLeasedGrants++
					}
					if prev > 0 {
						c.rep.BurnedPosition += v - prev
					}
				}
			}
			prev = max(prev, v)
		}
	}
}

// hwmIndex counts the decreases of every HWM key and indexes, per code,
// the first revision at which the key held each value.
func (c *checker) hwmIndex() map[codeKey]map[int64]int {
	first := map[codeKey]map[int64]int{}
	for w, vals := range c.cfg.HWM {
		k := codeKey{c.cfg.Region, w}
		first[k] = map[int64]int{}
		for i, v := range vals {
			if i > 0 && v < vals[i-1] {
				c.rep.HWMDecreases++
				c.example("hwm", "%v: high-water mark went from %d to %d", k, vals[i-1], v)
			}
			if _, ok := first[k][v]; !ok {
				first[k][v] = i
			}
		}
	}
	return first
}

// hwmStep returns the index of the HWM step that committed b: the first
// value equal to b.Hi, with the value before it at or below b.Lo. A block
// that is no such step is counted in BlocksNotInEtcd.
func (c *checker) hwmStep(k codeKey, b *blockInfo, first map[int64]int) (int, bool) {
	i, ok := first[b.Hi]
	if !ok {
		c.rep.BlocksNotInEtcd++
		c.example("etcd", "%v: %s received [%d,%d) but the HWM key never held %d", k, b.proc.Name, b.Lo, b.Hi, b.Hi)
		return 0, false
	}
	var prev int64
	if i > 0 {
		prev = c.cfg.HWM[k.worker][i-1]
	}
	if b.Lo < prev {
		c.rep.BlocksNotInEtcd++
		c.example("etcd", "%v: %s received [%d,%d) but the HWM was already %d before it reached %d",
			k, b.proc.Name, b.Lo, b.Hi, prev, b.Hi)
		return 0, false
	}
	return i, true
}

// sharedStep returns the index of the HWM step a shared run was carved
// from: the first value at or above r.Hi, with the value before it at or
// below r.Lo (a replica's minter carves a run from one block, one committed
// step; the key only grows, which hwmIndex checks). A run within no step
// is counted in BlocksNotInEtcd: its positions were never granted.
func (c *checker) sharedStep(k codeKey, r *sharedInfo) (int, bool) {
	vals := c.cfg.HWM[k.worker]
	if k.region != c.cfg.Region {
		vals = nil
	}
	i := sort.Search(len(vals), func(i int) bool { return vals[i] >= r.Hi })
	var prev int64
	if i > 0 {
		prev = vals[i-1]
	}
	if i == len(vals) || r.Lo < prev {
		c.rep.BlocksNotInEtcd++
		c.example("etcd", "%v: %s received the shared run [%d,%d), inside no committed HWM step", k, r.proc.Name, r.Lo, r.Hi)
		return 0, false
	}
	return i, true
}
