package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/publicid"
	"github.com/idrange/idrange/snowflake"
)

// `rangesvc token` is the operator's side of package publicid: key files
// and tokens by hand (docs/public-ids.md; the rotation runbook is in
// docs/operations.md).

const tokenUsage = `usage: rangesvc token <command> [flags]

Public-ID tokens (docs/public-ids.md): an ID shown to untrusted clients as
a keyed, authenticated, reversible token of a kind (order, user, ...).

commands:
  keygen --out FILE                        write a new key file: one key, the primary
                                           (mode 0600; FILE must not exist)
  keygen --rotate FILE [--stage]           add a new key to FILE and make it the primary;
                                           the old keys keep decoding. --stage: add it for
                                           decoding only, promote it later
  promote --keys FILE ID                   make key ID of FILE the primary
  encode --keys FILE --kind KIND ID...     print one token per ID
  decode --keys FILE --kind KIND TOKEN...  print one ID per token; a token that does not
                                           decode exits 1, naming it
`

// tokenConfig is `rangesvc token`'s command and flags.
type tokenConfig struct {
	Command string   // keygen, promote, encode or decode
	Out     string   // keygen --out FILE: the new key file
	Rotate  string   // keygen --rotate FILE: the key file to add a key to
	Stage   bool     // keygen --rotate --stage: the new key is not the primary
	Keys    string   // promote, encode, decode --keys FILE (required)
	Kind    string   // encode, decode --kind KIND (required)
	Args    []string // promote: the key ID; encode: IDs; decode: tokens
}

func parseTokenFlags(args []string, stderr io.Writer) (tokenConfig, error) {
	var c tokenConfig
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		fmt.Fprint(stderr, tokenUsage)
		if len(args) == 0 {
			return c, cli.Usagef("missing command: keygen, promote, encode or decode")
		}
		return c, cli.ErrHelp
	}
	c.Command, args = args[0], args[1:]
	fs := cli.NewFlagSet(prog, "token "+c.Command, stderr)
	switch c.Command {
	case "keygen":
		fs.StringVar(&c.Out, "out", "", "write a new key file here (must not exist)")
		fs.StringVar(&c.Rotate, "rotate", "", "add a new key to this key file, as the primary unless --stage")
		fs.BoolVar(&c.Stage, "stage", false, "with --rotate: add the key for decoding only (promote it once every reader has the file)")
	case "promote", "encode", "decode":
		fs.StringVar(&c.Keys, "keys", "", "key file (rangesvc token keygen writes it; required)")
		if c.Command != "promote" {
			fs.StringVar(&c.Kind, "kind", "", "kind of the tokens, e.g. order or user (required): a token of one kind never decodes as another")
		}
	default:
		fmt.Fprint(stderr, tokenUsage)
		return c, cli.Usagef("unknown command %q: want keygen, promote, encode or decode", c.Command)
	}
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), tokenUsage+"\nflags of token "+c.Command+":\n")
		fs.PrintDefaults()
	}
	if err := cli.ParseFlags(fs, args); err != nil {
		return c, err
	}
	c.Args = fs.Args()
	switch c.Command {
	case "keygen":
		switch {
		case (c.Out == "") == (c.Rotate == ""):
			return c, cli.Usagef("want exactly one of --out FILE (a new key file) and --rotate FILE (add a key)")
		case c.Stage && c.Rotate == "":
			return c, cli.Usagef("--stage goes with --rotate")
		case len(c.Args) > 0:
			return c, cli.Usagef("unexpected arguments %q", c.Args)
		}
	case "promote":
		if len(c.Args) != 1 {
			return c, cli.Usagef("want one key ID, got %d arguments", len(c.Args))
		}
	default:
		switch {
		case c.Kind == "" && !flagSet(fs, "kind"):
			return c, cli.Usagef("--kind is required")
		case len(c.Args) == 0 && c.Command == "encode":
			return c, cli.Usagef("no IDs given")
		case len(c.Args) == 0:
			return c, cli.Usagef("no tokens given")
		}
	}
	if c.Command != "keygen" && c.Keys == "" {
		return c, cli.Usagef("--keys FILE is required")
	}
	return c, nil
}

// runToken runs one token command. Every argument is checked before any
// output, so a bad one prints nothing on stdout.
func runToken(_ context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseTokenFlags(args, stderr)
	if err != nil {
		return err
	}
	switch c.Command {
	case "keygen":
		return tokenKeygen(c, stdout)
	case "promote":
		return tokenPromote(c, stdout)
	}
	keys, err := readTokenKeys("--keys", c.Keys)
	if err != nil {
		return err
	}
	codec, err := publicid.NewCodec(keys, c.Kind)
	if err != nil {
		return cli.UsageError{Err: errors.Wrap(err, "--kind")}
	}
	if c.Command == "encode" {
		return tokenEncode(codec, c.Args, stdout)
	}
	return tokenDecode(codec, c.Args, stdout, stderr)
}

// readTokenKeys reads a key file named by flag; a missing or invalid file is
// bad usage (exit 2), like a bad --config file.
func readTokenKeys(flag, path string) (*publicid.KeySet, error) {
	ks, err := publicid.ReadKeyFile(path)
	if err != nil {
		return nil, cli.UsageError{Err: errors.Wrap(err, flag)}
	}
	return ks, nil
}

func tokenKeygen(c tokenConfig, stdout io.Writer) error {
	if c.Out != "" {
		ks := publicid.GenerateKeySet()
		if err := writeKeyFile(c.Out, ks, false); err != nil {
			return err
		}
		_, err := fmt.Fprintf(stdout, "%s: new key file; %s\n", c.Out, describeKeys(ks))
		return err
	}
	ks, err := readTokenKeys("--rotate", c.Rotate)
	if err != nil {
		return err
	}
	ks, id, err := ks.AddKey()
	if err != nil {
		return errors.Wrap(err, c.Rotate)
	}
	what := "staged for decoding; make it the primary with: rangesvc token promote --keys " + c.Rotate + " " + strconv.Itoa(id)
	if !c.Stage {
		if ks, err = ks.WithPrimary(id); err != nil {
			return err
		}
		what = "the primary"
	}
	if err := writeKeyFile(c.Rotate, ks, true); err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s: added key %d, %s; %s\n", c.Rotate, id, what, describeKeys(ks))
	return err
}

func tokenPromote(c tokenConfig, stdout io.Writer) error {
	id, err := strconv.Atoi(c.Args[0])
	if err != nil {
		return cli.Usagef("key ID %q is not a number", c.Args[0])
	}
	ks, err := readTokenKeys("--keys", c.Keys)
	if err != nil {
		return err
	}
	if ks, err = ks.WithPrimary(id); err != nil {
		return cli.UsageError{Err: errors.Wrapf(err, "--keys %s", c.Keys)}
	}
	if err := writeKeyFile(c.Keys, ks, true); err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s: key %d is the primary; %s\n", c.Keys, id, describeKeys(ks))
	return err
}

// describeKeys is "keys 0 1, primary 1".
func describeKeys(ks *publicid.KeySet) string {
	ids := make([]string, 0, len(ks.IDs()))
	for _, id := range ks.IDs() {
		ids = append(ids, strconv.Itoa(id))
	}
	return fmt.Sprintf("keys %s, primary %d", strings.Join(ids, " "), ks.Primary())
}

func tokenEncode(codec *publicid.Codec, args []string, stdout io.Writer) error {
	ids := make([]snowflake.ID, len(args))
	for i, a := range args {
		id, err := snowflake.Parse(a)
		if err != nil {
			return cli.UsageError{Err: err}
		}
		ids[i] = id
	}
	for _, id := range ids {
		if _, err := fmt.Fprintln(stdout, codec.Encode(int64(id))); err != nil {
			return err
		}
	}
	return nil
}

// tokenDecode prints the ID of every token, or, if any does not decode,
// nothing on stdout and one line per such token on stderr (exit 1).
func tokenDecode(codec *publicid.Codec, tokens []string, stdout, stderr io.Writer) error {
	ids := make([]int64, len(tokens))
	failed := 0
	for i, tok := range tokens {
		id, err := codec.Decode(tok)
		if err != nil {
			fmt.Fprintf(stderr, "%s token decode: %q: %v\n", prog, tok, err)
			failed++
		}
		ids[i] = id
	}
	if failed > 0 {
		return cli.ExitError{Code: cli.ExitFailure}
	}
	for _, id := range ids {
		if _, err := fmt.Fprintln(stdout, id); err != nil {
			return err
		}
	}
	return nil
}

// writeKeyFile writes ks's key file to path with mode 0600, atomically:
// a temporary file in the same directory, synced, then renamed over path
// (replace) or hard-linked to it, which fails if path exists (a new file
// never overwrites one).
func writeKeyFile(path string, ks *publicid.KeySet, replace bool) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+"-*") // mode 0600
	if err != nil {
		return errors.Wrap(err, "key file")
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(ks.KeyFile())
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
	case replace:
		err = os.Rename(tmp.Name(), path)
	default:
		if err = os.Link(tmp.Name(), path); errors.Is(err, os.ErrExist) {
			return cli.Usagef("--out %s: the file exists; keygen --out never overwrites a key file (add a key with --rotate)", path)
		}
	}
	if err == nil {
		err = syncDir(dir)
	}
	return errors.Wrapf(err, "write key file %s", path)
}

// syncDir makes a rename or link in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
