package store

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// batcher is the Store's group commit over a BatchStorage: grant commits
// for different codes that arrive while a commit is in flight are sent
// together as the next one, so one storage write (one etcd raft entry and
// fsync) serves them all. There is no wait: a commit arriving at an idle
// batcher is sent at once, alone, as CommitHighWater (exactly the
// single-code transaction), so latency at low load is unchanged; under load
// the batch is whatever queued during the commit in flight. A queue that
// holds a full batch (MaxBatch) is sent at once too, whatever is in
// flight, so a slow storage never caps the grant rate at one batch per
// round trip: the slower the storage, the bigger the batches.
//
// Each op keeps its own compares (the storage fences it separately); one
// op's failed compare fails only that op. A batch whose write errors fails
// every op in it with that error: every caller sees the unknown-outcome
// path and burns its range.
type batcher struct {
	stg     BatchStorage
	max     int
	timeout time.Duration

	mu       sync.Mutex
	queue    []*pendingCommit
	inFlight int // commits sent and not yet answered
}

// pendingCommit is one caller's op waiting in the queue.
type pendingCommit struct {
	ctx  context.Context
	op   GrantOp
	done chan commitOutcome // buffered: the committer never blocks on it
}

type commitOutcome struct {
	res GrantResult
	err error
}

func newBatcher(stg BatchStorage, timeout time.Duration) *batcher {
	return &batcher{stg: stg, max: max(stg.MaxBatch(), 1), timeout: timeout}
}

// commit commits op, alone or with others, and returns its outcome. An
// error means the outcome is unknown (the op may have been committed).
func (b *batcher) commit(ctx context.Context, op GrantOp) (GrantResult, error) {
	p := &pendingCommit{ctx: ctx, op: op, done: make(chan commitOutcome, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, p)
	batch := b.nextLocked()
	b.mu.Unlock()
	if batch != nil {
		// Idle (the batch is p alone) or a full batch: send it from this
		// goroutine, then hand what queued meanwhile to another.
		b.send(batch)
		b.finished()
	}
	select {
	case o := <-p.done:
		return o.res, o.err
	case <-ctx.Done():
		// The op may still be sent or committed: the caller burns it.
		return GrantResult{}, ctx.Err()
	}
}

// nextLocked takes the next batch to send now, if one is due: when nothing
// is in flight, or when a full batch is waiting.
func (b *batcher) nextLocked() []*pendingCommit {
	if len(b.queue) == 0 || (b.inFlight > 0 && len(b.queue) < b.max) {
		return nil
	}
	batch := b.takeLocked()
	if len(batch) == 0 {
		return nil
	}
	b.inFlight++
	return batch
}

// finished records that a commit was answered and sends, from a new
// goroutine, the batch that is due now, if any.
func (b *batcher) finished() {
	b.mu.Lock()
	b.inFlight--
	batch := b.nextLocked()
	b.mu.Unlock()
	if batch != nil {
		go func() {
			b.send(batch)
			b.finished()
		}()
	}
}

// takeLocked removes up to max ops for distinct codes from the head of the
// queue. (One Store runs one grant per code at a time, so a second op for a
// code cannot be queued; should one be, it waits for the next batch.)
func (b *batcher) takeLocked() []*pendingCommit {
	var batch, rest []*pendingCommit
	for _, p := range b.queue {
		if len(batch) < b.max && !hasCode(batch, p.op) {
			batch = append(batch, p)
		} else {
			rest = append(rest, p)
		}
	}
	b.queue = rest
	return batch
}

func hasCode(batch []*pendingCommit, op GrantOp) bool {
	for _, p := range batch {
		if p.op.Region == op.Region && p.op.Worker == op.Worker {
			return true
		}
	}
	return false
}

// send commits one batch and hands every op its outcome. Ops whose caller
// has given up are not sent.
func (b *batcher) send(batch []*pendingCommit) {
	live := batch[:0]
	for _, p := range batch {
		if err := p.ctx.Err(); err != nil {
			p.done <- commitOutcome{err: err}
			continue
		}
		live = append(live, p)
	}
	switch len(live) {
	case 0:
		return
	case 1:
		// Alone: today's single-code transaction, under the caller's own
		// context.
		p := live[0]
		rev, ok, fresh, err := b.stg.CommitHighWater(p.ctx, p.op.Region, p.op.Worker, p.op.Commit)
		p.done <- commitOutcome{res: GrantResult{Rev: rev, OK: ok, Fresh: fresh}, err: err}
		return
	}
	ops := make([]GrantOp, len(live))
	for i, p := range live {
		ops[i] = p.op
	}
	// The batch outlives any one caller's context: a caller that gives up
	// treats its op as unknown, whatever the batch does.
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	res, err := b.stg.CommitHighWaters(ctx, ops)
	cancel()
	if err == nil && len(res) != len(ops) {
		err = fmt.Errorf("storage returned %d results for a batch of %d grants", len(res), len(ops))
	}
	for i, p := range live {
		if err != nil {
			p.done <- commitOutcome{err: err}
			continue
		}
		p.done <- commitOutcome{res: res[i]}
	}
}
