package publicid_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idrange/idrange/publicid"
)

// A service shows orders at /orders/{token}: it encodes the order's ID on
// the way out and decodes the token before any database read. The key file
// is what `rangesvc token keygen --out FILE` writes.
func Example() {
	dir, _ := os.MkdirTemp("", "keys")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "token.keys")
	_ = os.WriteFile(path, publicid.GenerateKeySet().KeyFile(), 0o600)

	keys, err := publicid.ReadKeyFile(path)
	if err != nil {
		panic(err)
	}
	orders, err := publicid.NewCodec(keys, "order")
	if err != nil {
		panic(err)
	}
	tok := orders.Encode(153652455016566789)
	id, err := orders.Decode(tok)
	fmt.Println(len(tok), tok[0], id, err)

	// A user token is not an order token; neither is anything altered.
	users, _ := publicid.NewCodec(keys, "user")
	_, err = orders.Decode(users.Encode(153652455016566789))
	fmt.Println(errors.Is(err, publicid.ErrNotAuthentic))
	_, err = orders.Decode(tok[:22])
	fmt.Println(errors.Is(err, publicid.ErrMalformed))
	// Output:
	// 23 65 153652455016566789 <nil>
	// true
	// true
}

// Rotation: a new primary key encodes, the old one keeps decoding.
func ExampleKeySet_AddKey() {
	old := publicid.GenerateKeySet()
	oldOrders, _ := publicid.NewCodec(old, "order")
	oldTok := oldOrders.Encode(42)

	staged, id, _ := old.AddKey() // rangesvc token keygen --rotate FILE --stage
	rotated, _ := staged.WithPrimary(id)
	orders, _ := publicid.NewCodec(rotated, "order")
	v, err := orders.Decode(oldTok)
	fmt.Println(v, err, rotated, orders.Encode(42)[:1])
	// Output: 42 <nil> publicid.KeySet{keys: 0 1, primary: 1} B
}
