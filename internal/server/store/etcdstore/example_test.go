package etcdstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/server/store/etcdstore"
)

// Example shows the life of a worker code on the etcd-backed Store: lease a
// code, take blocks, renew, release. (Compiled, not run: it needs an etcd.)
func Example() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	stg, err := etcdstore.New(cli, etcdstore.Config{}) // keys under /idrange/v1/
	if err != nil {
		log.Fatal(err)
	}
	st, err := store.New(stg, store.Config{}) // the grant loop; 10 s leases
	if err != nil {
		log.Fatal(err)
	}
	sent := time.Now()
	l, err := st.Acquire(ctx, 1, "host-a/4242")
	if err != nil {
		log.Fatal(err) // errors.Is(err, segment.ErrNoFreeCode): retry later
	}
	safeUntil := sent.Add(l.TTL - time.Second) // stop minting past this, renewal or not
	b, err := st.Allocate(ctx, l, 4_096_000)   // about 1 s of span
	if err != nil {
		log.Fatal(err) // ErrFenced / ErrLeaseLost: stop; *Backpressure: wait RetryAfter
	}
	fmt.Println(b.ID(b.Lo), b.ValidUntil, safeUntil)
	if l, err = st.Renew(ctx, l); err != nil {
		log.Fatal(err)
	}
	_ = st.Release(ctx, l) // the code's HWM stays: the next owner starts above it
}
