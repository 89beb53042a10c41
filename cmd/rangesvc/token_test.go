package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/publicid"
)

// tokenOK runs `rangesvc token args...` and wants exit 0; it returns
// stdout's lines.
func tokenOK(t *testing.T, args ...string) []string {
	t.Helper()
	code, out, errs := runCmd(append([]string{"token"}, args...)...)
	if code != cli.ExitOK {
		t.Fatalf("token %q: exit %d, stderr %q", args, code, errs)
	}
	return strings.Split(strings.TrimSuffix(out, "\n"), "\n")
}

func fileMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

// The commands end to end: a key file, tokens out and back, a
// refused token, rotation (direct, and staged then promoted).
func TestTokenCommands(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "token.keys")
	if out := tokenOK(t, "keygen", "--out", keys); out[0] != keys+": new key file; keys 0, primary 0" {
		t.Fatalf("keygen --out printed %q", out)
	}
	if m := fileMode(t, keys); m != 0o600 {
		t.Fatalf("key file mode %o, want 600", m)
	}
	before, _ := os.ReadFile(keys)
	code, out, errs := runCmd("token", "keygen", "--out", keys)
	if after, _ := os.ReadFile(keys); code != cli.ExitUsage || out != "" || !strings.Contains(errs, "never overwrites") || string(after) != string(before) {
		t.Fatalf("keygen --out over an existing file: exit %d, stdout %q, stderr %q, file changed: %v", code, out, errs, string(after) != string(before))
	}

	ids := []string{"153652455016566789", "153652455016566790", "4194304"}
	encode := func() []string {
		return tokenOK(t, append([]string{"encode", "--keys", keys, "--kind", "order"}, ids...)...)
	}
	decode := func(tokens ...string) []string {
		return tokenOK(t, append([]string{"decode", "--keys", keys, "--kind", "order"}, tokens...)...)
	}
	tokens := encode()
	// The library agrees with the command, key file and all.
	ks, err := publicid.ReadKeyFile(keys)
	if err != nil {
		t.Fatal(err)
	}
	codec, err := publicid.NewCodec(ks, "order")
	if err != nil {
		t.Fatal(err)
	}
	if len(tokens) != len(ids) || tokens[0] != codec.Encode(153652455016566789) || tokens[0][0] != 'A' || len(tokens[0]) != publicid.TokenLen {
		t.Fatalf("encode printed %q", tokens)
	}
	if got := decode(tokens...); strings.Join(got, " ") != strings.Join(ids, " ") {
		t.Fatalf("decode printed %q, want %q", got, ids)
	}

	// A token that does not decode: exit 1, each bad one named on stderr,
	// nothing on stdout.
	altered := tokens[1][:9] + "x" + tokens[1][10:]
	if altered == tokens[1] {
		altered = tokens[1][:9] + "y" + tokens[1][10:]
	}
	code, out, errs = runCmd("token", "decode", "--keys", keys, "--kind", "order", tokens[0], altered, "short")
	if code != cli.ExitFailure || out != "" ||
		!strings.Contains(errs, `"`+altered+`": not a token of kind "order" under key 0: publicid: token is not authentic`) ||
		!strings.Contains(errs, `"short": not 23 characters: publicid: malformed token`) || strings.Count(errs, "\n") != 2 {
		t.Fatalf("decode of bad tokens: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if code, out, errs := runCmd("token", "decode", "--keys", keys, "--kind", "user", tokens[0]); code != cli.ExitFailure || out != "" || !strings.Contains(errs, "not authentic") {
		t.Fatalf("an order token as a user token: exit %d, stdout %q, stderr %q", code, out, errs)
	}

	// Rotation: a new primary; old tokens still decode.
	if out := tokenOK(t, "keygen", "--rotate", keys); out[0] != keys+": added key 1, the primary; keys 0 1, primary 1" {
		t.Fatalf("keygen --rotate printed %q", out)
	}
	rotated := encode()
	if rotated[0][0] != 'B' || rotated[0] == tokens[0] {
		t.Fatalf("after rotation encode printed %q; want key id B", rotated)
	}
	if got := decode(append(tokens, rotated...)...); strings.Join(got, " ") != strings.Join(append(ids, ids...), " ") {
		t.Fatalf("after rotation decode printed %q", got)
	}
	// Staged: decodes, does not encode until promoted.
	out1 := tokenOK(t, "keygen", "--rotate", keys, "--stage")
	if !strings.HasPrefix(out1[0], keys+": added key 2, staged for decoding; make it the primary with: rangesvc token promote --keys "+keys+" 2") {
		t.Fatalf("keygen --rotate --stage printed %q", out1)
	}
	if got := encode(); strings.Join(got, " ") != strings.Join(rotated, " ") {
		t.Fatalf("a staged key changed the tokens: %q, want %q", got, rotated)
	}
	if out := tokenOK(t, "promote", "--keys", keys, "2"); out[0] != keys+": key 2 is the primary; keys 0 1 2, primary 2" {
		t.Fatalf("promote printed %q", out)
	}
	promoted := encode()
	if promoted[0][0] != 'C' {
		t.Fatalf("after promote encode printed %q; want key id C", promoted)
	}
	if got := decode(tokens[0], rotated[0], promoted[0]); strings.Join(got, " ") != strings.Join([]string{ids[0], ids[0], ids[0]}, " ") {
		t.Fatalf("every generation decodes: %q", got)
	}
	// Rewrites keep mode 0600 and leave no temporary file behind.
	if m := fileMode(t, keys); m != 0o600 {
		t.Fatalf("key file mode %o after rewrites, want 600", m)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("directory holds %d files after rewrites, want the key file only", len(entries))
	}
}

func TestTokenBadUsage(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "token.keys")
	tokenOK(t, "keygen", "--out", keys)
	bad := filepath.Join(dir, "bad.keys")
	if err := os.WriteFile(bad, []byte("key 0 AAAA\nprimary 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.keys")
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{}, "missing command"},
		{[]string{"frob"}, `unknown command "frob"`},
		{[]string{"keygen"}, "want exactly one of --out FILE"},
		{[]string{"keygen", "--out", missing, "--rotate", keys}, "want exactly one of --out FILE"},
		{[]string{"keygen", "--out", missing, "--stage"}, "--stage goes with --rotate"},
		{[]string{"keygen", "--out", missing, "extra"}, "unexpected arguments"},
		{[]string{"keygen", "--rotate", missing}, "no such file"},
		{[]string{"keygen", "--rotate", bad}, "line 1: key 0: secret is 3 bytes, want 32"},
		{[]string{"keygen", "--bogus"}, "flag provided but not defined"},
		{[]string{"encode", "--kind", "order", "1"}, "--keys FILE is required"},
		{[]string{"encode", "--keys", keys, "1"}, "--kind is required"},
		{[]string{"encode", "--keys", keys, "--kind", "order"}, "no IDs given"},
		{[]string{"encode", "--keys", keys, "--kind", "or der", "1"}, "publicid: invalid kind"},
		{[]string{"encode", "--keys", keys, "--kind", "", "1"}, "kind is 0 bytes"},
		{[]string{"encode", "--keys", keys, "--kind", "order", "abc"}, "not a decimal integer"},
		{[]string{"encode", "--keys", keys, "--kind", "order", "0"}, "never minted"},
		{[]string{"encode", "--keys", missing, "--kind", "order", "1"}, "no such file"},
		{[]string{"encode", "--keys", bad, "--kind", "order", "1"}, bad + ": line 1: key 0: secret is 3 bytes"},
		{[]string{"decode", "--keys", keys, "--kind", "order"}, "no tokens given"},
		{[]string{"decode", "--keys", keys}, "--kind is required"},
		{[]string{"promote", "--keys", keys}, "want one key ID, got 0"},
		{[]string{"promote", "--keys", keys, "x"}, `key ID "x" is not a number`},
		{[]string{"promote", "--keys", keys, "9"}, "primary key 9 is not one of the keys (0)"},
		{[]string{"promote", "--kind", "order", "--keys", keys, "0"}, "flag provided but not defined: -kind"},
	} {
		code, out, errs := runCmd(append([]string{"token"}, tc.args...)...)
		if code != cli.ExitUsage || out != "" || !strings.Contains(errs, tc.msg) {
			t.Errorf("token %q: exit %d, stdout %q, stderr %q; want exit 2, no output, %q", tc.args, code, out, errs, tc.msg)
		}
	}
	for _, args := range [][]string{{"-h"}, {"keygen", "-h"}, {"decode", "--help"}} {
		if code, out, errs := runCmd(append([]string{"token"}, args...)...); code != cli.ExitOK || out != "" || !strings.Contains(errs, "usage: rangesvc token") {
			t.Errorf("token %q: exit %d, stdout %q, stderr %q; want exit 0 and the usage on stderr", args, code, out, errs)
		}
	}
}
