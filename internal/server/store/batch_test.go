package store

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// gatedBatches is a BatchStorage (only the batch methods) that records the
// batches it is sent and holds each until the test releases it.
type gatedBatches struct {
	Storage // nil: the batcher calls only the methods below
	max     int
	release chan error // one value per commit: its error (nil: commit)

	mu      sync.Mutex
	batches [][]GrantOp
}

func (g *gatedBatches) MaxBatch() int { return g.max }

func (g *gatedBatches) CommitHighWater(ctx context.Context, region, worker int, c HighWaterCommit) (int64, bool, CodeView, error) {
	r, err := g.CommitHighWaters(ctx, []GrantOp{{Region: region, Worker: worker, Commit: c}})
	if err != nil {
		return 0, false, CodeView{}, err
	}
	return r[0].Rev, r[0].OK, r[0].Fresh, nil
}

// CommitHighWaters succeeds for ops whose Token is odd and fails the
// compare of the others, at revision 100 + batch number.
func (g *gatedBatches) CommitHighWaters(ctx context.Context, ops []GrantOp) ([]GrantResult, error) {
	g.mu.Lock()
	g.batches = append(g.batches, ops)
	rev := int64(100 + len(g.batches))
	g.mu.Unlock()
	if err := <-g.release; err != nil {
		return nil, err
	}
	out := make([]GrantResult, len(ops))
	for i, op := range ops {
		if op.Commit.Token%2 == 1 {
			out[i] = GrantResult{Rev: rev, OK: true}
		} else {
			out[i] = GrantResult{Fresh: CodeView{Rev: rev}}
		}
	}
	return out, nil
}

func (g *gatedBatches) sizes() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	var n []int
	for _, b := range g.batches {
		n = append(n, len(b))
	}
	return n
}

type outcome struct {
	res GrantResult
	err error
}

// start runs b.commit for code worker with token in a goroutine.
func start(b *batcher, worker int, token int64) chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		r, err := b.commit(context.Background(), GrantOp{Worker: worker, Commit: HighWaterCommit{Token: token}})
		ch <- outcome{r, err}
	}()
	return ch
}

// TestGroupCommitLoop: the first commit goes alone and at once; what
// arrives while it is in flight forms the next batch, except that a full
// batch (MaxBatch) is sent at once;
// each op gets its own outcome, and a failed batch fails all its ops.
func TestGroupCommitLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &gatedBatches{max: 4, release: make(chan error)}
		b := newBatcher(g, time.Second)

		first := start(b, 0, 1)
		synctest.Wait() // first is in the storage, alone
		if got := g.sizes(); len(got) != 1 || got[0] != 1 {
			t.Fatalf("batches %v; want the first op sent at once, alone", got)
		}
		var waiting []chan outcome
		for w := 1; w <= 6; w++ {
			waiting = append(waiting, start(b, w, int64(w)))
		}
		synctest.Wait() // a full batch (MaxBatch 4) is sent at once; 2 queue
		if got := g.sizes(); len(got) != 2 || got[1] != 4 {
			t.Fatalf("batches %v while the first commit is in flight; want [1 4]: a full batch does not wait", got)
		}
		g.release <- nil
		g.release <- nil
		if o := <-first; o.err != nil || !o.res.OK || o.res.Rev != 101 {
			t.Fatalf("first op: %+v", o)
		}
		synctest.Wait() // the 2 left are the next batch
		g.release <- errors.New("injected: outcome unknown")
		batchOf := map[int]int{} // worker -> index of the batch that carried it
		for i, ops := range g.batches {
			for _, op := range ops {
				batchOf[op.Worker] = i
			}
		}
		for i, ch := range waiting {
			o := <-ch
			w := i + 1
			token := int64(w)
			switch {
			case batchOf[w] == 1 && token%2 == 1 && (o.err != nil || !o.res.OK || o.res.Rev != 102):
				t.Errorf("op %d: %+v; want committed at revision 102", w, o)
			case batchOf[w] == 1 && token%2 == 0 && (o.err != nil || o.res.OK || o.res.Fresh.Rev != 102):
				t.Errorf("op %d: %+v; want its compare failed alone, fresh view at 102", w, o)
			case batchOf[w] == 2 && (o.err == nil || o.res.OK):
				t.Errorf("op %d: %+v; want the batch's error (outcome unknown)", w, o)
			case batchOf[w] == 0:
				t.Errorf("op %d was sent with the first op, which was in flight when it arrived", w)
			}
		}
		if got := g.sizes(); len(got) != 3 || got[1] != 4 || got[2] != 2 {
			t.Fatalf("batch sizes %v; want [1 4 2]", got)
		}
		for _, ops := range g.batches {
			seen := map[int]bool{}
			for _, op := range ops {
				if seen[op.Worker] {
					t.Fatalf("code %d twice in one batch", op.Worker)
				}
				seen[op.Worker] = true
			}
		}

		// Idle again: the next op goes alone, at once.
		again := start(b, 9, 3)
		synctest.Wait()
		g.release <- nil
		if o := <-again; o.err != nil || !o.res.OK {
			t.Fatalf("op after idle: %+v", o)
		}
		if got := g.sizes(); got[len(got)-1] != 1 {
			t.Fatalf("batch sizes %v; want the op after idle alone", got)
		}
	})
}

// TestGroupCommitSameCodeWaits: two ops for one code never share a batch.
func TestGroupCommitSameCodeWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &gatedBatches{max: 8, release: make(chan error)}
		b := newBatcher(g, time.Second)
		first := start(b, 0, 1)
		synctest.Wait()
		a, c, d := start(b, 5, 1), start(b, 5, 3), start(b, 6, 1)
		synctest.Wait()
		for range 3 {
			g.release <- nil
			synctest.Wait()
		}
		for _, ch := range []chan outcome{first, a, c, d} {
			if o := <-ch; o.err != nil || !o.res.OK {
				t.Fatalf("outcome %+v", o)
			}
		}
		if got := g.sizes(); len(got) != 3 || got[1] != 2 || got[2] != 1 {
			t.Fatalf("batch sizes %v; want [1 2 1] (the second op on code 5 waits)", got)
		}
	})
}

// TestGroupCommitCallerGivesUp: a caller whose context ends while queued
// gets its error and its op is not sent.
func TestGroupCommitCallerGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &gatedBatches{max: 8, release: make(chan error)}
		b := newBatcher(g, time.Second)
		first := start(b, 0, 1)
		synctest.Wait()
		ctx, cancel := context.WithCancel(context.Background())
		gone := make(chan error, 1)
		go func() {
			_, err := b.commit(ctx, GrantOp{Worker: 1, Commit: HighWaterCommit{Token: 1}})
			gone <- err
		}()
		synctest.Wait()
		cancel()
		if err := <-gone; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled caller: %v", err)
		}
		g.release <- nil
		<-first
		synctest.Wait()
		if got := g.sizes(); len(got) != 1 {
			t.Fatalf("batch sizes %v; the cancelled op must not be sent", got)
		}
	})
}
