package snowflake_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idrange/idrange/snowflake"
)

// A generator for one statically assigned worker code, with its ceiling in a
// file so a restart never re-enters used space.
func ExampleNewGenerator() {
	dir, _ := os.MkdirTemp("", "hwm")
	defer os.RemoveAll(dir)

	gen, err := snowflake.NewGenerator(snowflake.Config{
		Region:    1,
		Worker:    42,
		HighWater: snowflake.NewFileHighWater(filepath.Join(dir, "r1-w42.hwm")),
	})
	if err != nil {
		panic(err)
	}
	id, err := gen.Next(context.Background())
	if err != nil {
		panic(err)
	}
	p := id.Parts()
	fmt.Println(p.Region, p.Worker, id > 0)
	// Output: 1 42 true
}

func ExampleCompose() {
	id, err := snowflake.Compose(1500, 2, 7, 9)
	if err != nil {
		panic(err)
	}
	fmt.Println(id, id.Parts().Format(id))
	// Output: 6293581833 id=6293581833 time=2026-01-01T00:00:01.5Z region=2 worker=7 seq=9
}

func ExampleParse() {
	_, err := snowflake.Parse("-12")
	fmt.Println(err)
	// Output: -12 has the sign bit set: snowflake: invalid id
}
