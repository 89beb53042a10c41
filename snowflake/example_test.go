package snowflake_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

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

func ExampleDecode() {
	p, err := snowflake.Decode(6293581833)
	if err != nil {
		panic(err)
	}
	fmt.Println(p.Time.Format(time.RFC3339Nano), p.Ms, p.Region, p.Worker, p.Sequence)
	// Output: 2026-01-01T00:00:01.5Z 1500 2 7 9
}

// IDs travel through JSON as decimal strings, which keeps all 64 bits in
// JavaScript.
func ExampleID_MarshalText() {
	b, _ := json.Marshal(struct{ ID snowflake.ID }{6293581833})
	fmt.Println(string(b))

	var back struct{ ID snowflake.ID }
	err := json.Unmarshal([]byte(`{"ID":"-1"}`), &back)
	fmt.Println(errors.Is(err, snowflake.ErrInvalidID))
	// Output:
	// {"ID":"6293581833"}
	// true
}
