package segment

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
// the batch is whatever queued during the previous commit, up to MaxBatch.
//
// Each op keeps its own compares (the storage fences it separately); one
// op's failed compare fails only that op. A batch whose write errors fails
// every op in it with that error: every caller sees the unknown-outcome
// path and burns its range.
type batcher struct {
	stg     BatchStorage
	max     int
	timeout time.Duration

	mu      sync.Mutex
	queue   []*pendingCommit
	running bool // a goroutine (or a leading caller) is committing
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
	lead := !b.running
	b.running = true
	var batch []*pendingCommit
	if lead {
		// The batcher was idle, so the queue held nothing but p: commit it
		// now, in this goroutine.
		batch = b.takeLocked()
	}
	b.mu.Unlock()
	if lead {
		b.send(batch)
		b.mu.Lock()
		if len(b.queue) > 0 {
			go b.run() // what queued meanwhile is the next batch
		} else {
			b.running = false
		}
		b.mu.Unlock()
	}
	select {
	case o := <-p.done:
		return o.res, o.err
	case <-ctx.Done():
		// The op may still be sent or committed: the caller burns it.
		return GrantResult{}, ctx.Err()
	}
}

// run commits batches until the queue is empty.
func (b *batcher) run() {
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.running = false
			b.mu.Unlock()
			return
		}
		batch := b.takeLocked()
		b.mu.Unlock()
		b.send(batch)
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
