// Package node_test runs the Node.js example (publicid.mjs) against the
// known-answer vectors and against tokens the Go package makes under fresh
// random keys.
package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/publicid"
)

const vectorsFile = "../../publicid/testdata/vectors.json"

func lookNode(t *testing.T) string {
	return testenv.LookTool(t, "node", "the Node.js example is run with it; install it (Debian: apt-get install nodejs; .ci/run does)")
}

// runNode runs publicid.mjs with args: its stdout, stderr and error.
func runNode(t *testing.T, node string, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append([]string{"publicid.mjs"}, args...)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

// The acceptance: the Node example decodes every committed vector and
// encodes the same tokens (and refuses every refused one with the same
// error); with one vector altered it fails, naming it.
func TestNodeVectors(t *testing.T) {
	node := lookNode(t)
	raw, err := os.ReadFile(vectorsFile)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Tokens  []map[string]any `json:"tokens"`
		Refused []map[string]any `json:"refused"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	out, errs, err := runNode(t, node, "vectors", vectorsFile)
	want := fmt.Sprintf("vectors: %d tokens decoded and encoded, %d refused as expected\n", len(v.Tokens), len(v.Refused))
	if err != nil || out != want || len(v.Tokens) == 0 {
		t.Fatalf("node publicid.mjs vectors: %v, stdout %q, stderr %q; want %q", err, out, errs, want)
	}

	// Altered: a token's ID and a refusal's error. Node must fail on both.
	tok := v.Tokens[5]["token"].(string)
	v.Tokens[5]["id"] = "12345"
	v.Refused[0]["error"] = "malformed"
	raw, err = json.Marshal(map[string]any{"keys": json.RawMessage(keysOf(t, raw)), "tokens": v.Tokens, "refused": v.Refused})
	if err != nil {
		t.Fatal(err)
	}
	altered := filepath.Join(t.TempDir(), "vectors.json")
	if err := os.WriteFile(altered, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	out, errs, err = runNode(t, node, "vectors", altered)
	if code := exitCode(err); code != 1 || out != "" || !strings.Contains(errs, "ID 12345: encode gives") ||
		!strings.Contains(errs, strconv.Quote(tok)) || !strings.Contains(errs, "want malformed") {
		t.Fatalf("node on altered vectors: exit %d, stdout %q, stderr %q; want exit 1 naming both", code, out, errs)
	}
}

// keysOf is the raw "keys" member of the vectors file.
func keysOf(t *testing.T, raw []byte) []byte {
	var v struct {
		Keys json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	return v.Keys
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// Beyond the vectors: a key file of fresh random keys (rotated once, as
// rangesvc token keygen would), 200 random IDs; Node decodes Go's tokens of
// both keys, encodes the same tokens, and refuses an altered one and
// another kind's, naming them.
func TestNodeKeyFile(t *testing.T) {
	node := lookNode(t)
	old := publicid.GenerateKeySet()
	staged, id, err := old.AddKey()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := staged.WithPrimary(id)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "token.keys")
	if err := os.WriteFile(path, keys.KeyFile(), 0o600); err != nil {
		t.Fatal(err)
	}
	oldCodec, err := publicid.NewCodec(old, "order")
	if err != nil {
		t.Fatal(err)
	}
	codec, err := publicid.NewCodec(keys, "order")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 36))
	var ids, tokens, all []string
	for range 200 {
		id := int64(rng.Uint64() >> 1)
		ids = append(ids, strconv.FormatInt(id, 10))
		tokens = append(tokens, codec.Encode(id))
		all = append(all, oldCodec.Encode(id))
	}
	all = append(all, tokens...)

	out, errs, err := runNode(t, node, append([]string{"decode", "--keys", path, "--kind", "order"}, all...)...)
	if want := strings.Join(append(ids, ids...), "\n") + "\n"; err != nil || out != want {
		t.Fatalf("node decode: %v, stderr %q; stdout differs from the IDs:\n%s", err, errs, out)
	}
	out, errs, err = runNode(t, node, append([]string{"encode", "--keys", path, "--kind", "order"}, ids...)...)
	if want := strings.Join(tokens, "\n") + "\n"; err != nil || out != want {
		t.Fatalf("node encode: %v, stderr %q; stdout differs from Go's tokens:\n%s", err, errs, out)
	}

	swap := "A" // one character changed
	if tokens[0][7] == 'A' {
		swap = "B"
	}
	bad := tokens[0][:7] + swap + tokens[0][8:]
	out, errs, err = runNode(t, node, "decode", "--keys", path, "--kind", "user", tokens[1], bad)
	if code := exitCode(err); code != 1 || out != "" || !strings.Contains(errs, strconv.Quote(bad)+": not a token of kind \"user\"") ||
		!strings.Contains(errs, strconv.Quote(tokens[1])+": not a token of kind \"user\"") {
		t.Fatalf("node decode of refused tokens: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	out, errs, err = runNode(t, node, "decode", "--keys", path, "--kind", "order", bad, tokens[1][:22])
	if code := exitCode(err); code != 1 || out != "" || !strings.Contains(errs, strconv.Quote(bad)+": not a token of kind \"order\"") ||
		!strings.Contains(errs, strconv.Quote(tokens[1][:22])+": not a token (23 characters") {
		t.Fatalf("node decode of an altered and a truncated token: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}
