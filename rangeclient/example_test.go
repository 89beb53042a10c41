package rangeclient_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/rangeclient/rangeclienttest"
)

// The two lines a program needs: connect to the region's rangesvc replicas
// (two hosts, on the default port) and mint. (Compile-only: it needs a
// running service.)
func ExampleNew() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	c, err := rangeclient.New(ctx, rangeclient.Config{Targets: []string{"10.0.1.5:7070", "10.0.1.6:7070"}, Region: 1})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	id, err := c.Next(ctx)
	if err != nil {
		log.Fatal(err) // rangeclient.IsRetryable(err) tells whether to try again
	}
	fmt.Println(id)
}

// The same against an in-process range service (here the in-memory one from
// rangeclienttest; the service itself passes its store.Store).
func ExampleClient_Next() {
	ctx := context.Background()
	svc := rangeclienttest.New(rangeclienttest.Options{Region: 2})

	c, err := rangeclient.New(ctx, rangeclient.Config{Allocator: svc.Conn(), Region: 2})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	id, err := c.Next(ctx)
	if err != nil {
		log.Fatal(err)
	}
	p := id.Parts()
	fmt.Println("region", p.Region, "worker", p.Worker, "fresh", time.Since(p.Time) < time.Minute)
	// Output: region 2 worker 0 fresh true
}
