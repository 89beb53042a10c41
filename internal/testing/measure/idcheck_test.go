package measure

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

func mustCompose(t *testing.T, ms int64, region, worker, seq int) snowflake.ID {
	t.Helper()
	id, err := snowflake.Compose(ms, region, worker, seq)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// mint returns n unique IDs from a real generator for code (region, worker).
func mint(t *testing.T, region, worker, n int) []snowflake.ID {
	t.Helper()
	g, err := snowflake.NewGenerator(snowflake.Config{Region: region, Worker: worker, HighWater: snowflake.NewMemHighWater()})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := g.NextN(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestCleanSetPasses(t *testing.T) {
	c, err := NewChecker(CheckConfig{Expect: []Code{{1, 2}, {3, 4}}, RequireAll: true,
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	a, b := mint(t, 1, 2, 20000), mint(t, 3, 4, 5000)
	// Add in shuffled batches from several goroutines: order must not matter.
	all := append(append([]snowflake.ID{}, a...), b...)
	rand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	var wg sync.WaitGroup
	for i := 0; i < len(all); i += 1000 {
		wg.Go(func() { c.Add(all[i:min(i+1000, len(all))]...) })
	}
	wg.Wait()
	res := c.Check()
	if err := res.Err(); err != nil {
		t.Fatalf("clean set failed: %v", err)
	}
	if res.Checked != 25000 || res.Unique != 25000 || res.Duplicates != 0 || res.OutOfRange != 0 {
		t.Fatalf("counts: %+v", res)
	}
	want := []CodeCount{{Code{1, 2}, 20000}, {Code{3, 4}, 5000}}
	if len(res.Codes) != 2 || res.Codes[0] != want[0] || res.Codes[1] != want[1] {
		t.Fatalf("per-code counts %+v, want %+v", res.Codes, want)
	}
	if res.MinTime.After(res.MaxTime) || res.MinTime.IsZero() {
		t.Fatalf("time bounds %v..%v", res.MinTime, res.MaxTime)
	}
}

func TestPlantedDuplicateIsReported(t *testing.T) {
	c, err := NewChecker(CheckConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ids := mint(t, 0, 7, 10000)
	dup := ids[4321]
	c.Add(ids...)
	c.Add(dup)     // one surplus copy
	c.Add(ids[17]) // and another ID
	c.Add(ids[17]) // seen three times in all
	res := c.Check()
	err = res.Err()
	if !errors.Is(err, ErrDuplicate) {
		t.Fatalf("err = %v, want ErrDuplicate", err)
	}
	if res.Checked != 10003 || res.Unique != 10000 || res.Duplicates != 3 {
		t.Fatalf("counts: checked %d unique %d duplicates %d", res.Checked, res.Unique, res.Duplicates)
	}
	got := map[int64]int{}
	for _, d := range res.DuplicateExamples {
		got[d.ID] = d.Count
	}
	if got[int64(dup)] != 2 || got[int64(ids[17])] != 3 || len(got) != 2 {
		t.Fatalf("duplicate examples %+v", res.DuplicateExamples)
	}
}

func TestOutOfRangeIsReported(t *testing.T) {
	now := time.Now()
	c, err := NewChecker(CheckConfig{
		Expect:    []Code{{2, 5}},
		MaxWorker: 199,
		NotBefore: now.Add(-time.Minute),
		NotAfter:  now.Add(time.Minute),
	})
	if err != nil {
		t.Fatal(err)
	}
	good := mint(t, 2, 5, 100)
	c.Add(good...)
	ms := snowflake.MsSince(now)
	cases := map[int64]string{
		0:                                    "0 is never minted",
		-5:                                   "sign bit set",
		int64(mustCompose(t, ms, 2, 6, 0)):   "not expected",
		int64(mustCompose(t, ms, 1, 5, 0)):   "not expected",
		int64(mustCompose(t, ms, 2, 230, 0)): "above 199",
		int64(mustCompose(t, ms-int64(time.Hour/time.Millisecond), 2, 5, 0)): "before",
		int64(mustCompose(t, ms+int64(time.Hour/time.Millisecond), 2, 5, 0)): "after",
	}
	for v := range cases {
		c.AddInt64(v)
	}
	res := c.Check()
	if !errors.Is(res.Err(), ErrOutOfRange) {
		t.Fatalf("err = %v, want ErrOutOfRange", res.Err())
	}
	if res.Duplicates != 0 {
		t.Fatalf("duplicates %d", res.Duplicates)
	}
	if res.OutOfRange != int64(len(cases)) || res.Checked != 100+int64(len(cases)) {
		t.Fatalf("out of range %d of %d, want %d of %d", res.OutOfRange, res.Checked, len(cases), 100+len(cases))
	}
	for _, b := range res.OutOfRangeExamples {
		want, ok := cases[b.ID]
		if !ok {
			t.Errorf("good id %d reported: %s", b.ID, b.Reason)
			continue
		}
		if !contains(b.Reason, want) {
			t.Errorf("id %d: reason %q, want it to mention %q", b.ID, b.Reason, want)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestDuplicateTakesPrecedenceAndExamplesAreBounded(t *testing.T) {
	c, err := NewChecker(CheckConfig{MaxExamples: 2})
	if err != nil {
		t.Fatal(err)
	}
	ids := mint(t, 3, 3, 50)
	c.Add(ids...)
	c.Add(ids...) // every ID twice
	c.AddInt64(0)
	res := c.Check()
	if !errors.Is(res.Err(), ErrDuplicate) {
		t.Fatalf("err = %v, want ErrDuplicate first", res.Err())
	}
	if res.Duplicates != 50 || res.OutOfRange != 1 {
		t.Fatalf("duplicates %d out of range %d", res.Duplicates, res.OutOfRange)
	}
	if len(res.DuplicateExamples) != 2 || len(res.OutOfRangeExamples) != 1 {
		t.Fatalf("examples not bounded: %d dup, %d bad", len(res.DuplicateExamples), len(res.OutOfRangeExamples))
	}
}

func TestMissingCodeAndEmpty(t *testing.T) {
	c, err := NewChecker(CheckConfig{Expect: Codes([]int{0, 1}, 2), RequireAll: true})
	if err != nil {
		t.Fatal(err)
	}
	c.Add(mint(t, 0, 0, 10)...)
	c.Add(mint(t, 1, 1, 10)...)
	res := c.Check()
	if !errors.Is(res.Err(), ErrMissingCode) {
		t.Fatalf("err = %v, want ErrMissingCode", res.Err())
	}
	if len(res.MissingCodes) != 2 || res.MissingCodes[0] != (Code{0, 1}) || res.MissingCodes[1] != (Code{1, 0}) {
		t.Fatalf("missing %+v", res.MissingCodes)
	}

	empty, _ := NewChecker(CheckConfig{})
	if !errors.Is(empty.Check().Err(), ErrNothingChecked) {
		t.Fatal("an empty check must not pass")
	}
}

func TestCheckTwiceAndJSON(t *testing.T) {
	c, _ := NewChecker(CheckConfig{})
	ids := mint(t, 0, 1, 100)
	c.Add(ids[:50]...)
	if r := c.Check(); r.Err() != nil || r.Checked != 50 {
		t.Fatalf("first check: %+v %v", r, r.Err())
	}
	c.Add(ids[49:]...) // ids[49] again
	r := c.Check()
	if !errors.Is(r.Err(), ErrDuplicate) || r.Checked != 101 || r.DuplicateExamples[0].ID != int64(ids[49]) {
		t.Fatalf("second check: %+v %v", r, r.Err())
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back CheckResult
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Checked != r.Checked || back.Duplicates != 1 || back.DuplicateExamples[0].ID != int64(ids[49]) {
		t.Fatalf("JSON round trip lost data: %s", b)
	}
}

func TestConfigValidation(t *testing.T) {
	for name, cfg := range map[string]CheckConfig{
		"bad code":        {Expect: []Code{{4, 0}}},
		"bad worker":      {Expect: []Code{{0, 256}}},
		"require nothing": {RequireAll: true},
		"max worker":      {MaxWorker: 300},
		"window":          {NotBefore: time.Now(), NotAfter: time.Now().Add(-time.Second)},
		"capacity":        {Capacity: -1},
	} {
		if _, err := NewChecker(cfg); err == nil {
			t.Errorf("%s: config accepted", name)
		}
	}
}

// BenchmarkCheck10M measures the sort-and-scan on ten million IDs.
func BenchmarkCheck10M(b *testing.B) {
	const n = 10_000_000
	base := make([]int64, n)
	ms := snowflake.MsSince(time.Now())
	for i := range base {
		base[i] = int64(segment.Block{Region: i % 800 / 200, Worker: i % 200}.ID(ms<<12 + int64(i/800)))
	}
	rand.Shuffle(n, func(i, j int) { base[i], base[j] = base[j], base[i] })
	for b.Loop() {
		b.StopTimer()
		c, _ := NewChecker(CheckConfig{Capacity: n})
		c.AddInt64(base...)
		b.StartTimer()
		if r := c.Check(); r.Checked != n {
			b.Fatal(r.Checked)
		}
	}
}
