package cli

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testFlags is a FlagSet with one flag of each kind serve uses, including
// an accumulating fs.Func.
type testFlags struct {
	fs     *flag.FlagSet
	region int
	listen string
	ttl    time.Duration
	debug  bool
	etcd   []string
}

func newTestFlags() *testFlags {
	f := &testFlags{fs: NewFlagSet("prog", "serve", io.Discard)}
	f.fs.IntVar(&f.region, "region", -1, "")
	f.fs.StringVar(&f.listen, "listen", "127.0.0.1:7070", "")
	f.fs.DurationVar(&f.ttl, "lease-ttl", 10*time.Second, "")
	f.fs.BoolVar(&f.debug, "debug", false, "")
	f.fs.Func("etcd", "", func(s string) error {
		f.etcd = append(f.etcd, SplitList(s)...)
		return nil
	})
	return f
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rangesvc.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The file sets what the command line does not; the command line wins,
// also for an accumulating flag (no merge of the two lists).
func TestConfigFileAndFlagsMerge(t *testing.T) {
	p := writeConfig(t, `
region: 2
listen: 127.0.0.1:0
lease-ttl: 20s
debug: true
etcd: [10.0.0.1:2379, 10.0.0.2:2379]
`)
	f := newTestFlags()
	if err := ParseFlagsWithConfig(f.fs, []string{"--config", p, "--listen", "127.0.0.1:9999", "--etcd", "10.0.0.9:2379"}); err != nil {
		t.Fatal(err)
	}
	if f.region != 2 || f.listen != "127.0.0.1:9999" || f.ttl != 20*time.Second || !f.debug ||
		strings.Join(f.etcd, ",") != "10.0.0.9:2379" {
		t.Fatalf("merged config: region %d listen %q ttl %v debug %v etcd %q", f.region, f.listen, f.ttl, f.debug, f.etcd)
	}
	// Without the override the list is joined with ",".
	f = newTestFlags()
	if err := ParseFlagsWithConfig(f.fs, []string{"--config", p}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(f.etcd, ",") != "10.0.0.1:2379,10.0.0.2:2379" || f.listen != "127.0.0.1:0" {
		t.Fatalf("file only: listen %q etcd %q", f.listen, f.etcd)
	}
}

func TestConfigFileErrors(t *testing.T) {
	cases := []struct{ name, body, msg string }{
		{"unknown key", "region: 1\nregoin: 2\n", `unknown key "regoin" (not a flag of prog serve)`},
		{"bad int", "region: two\n", `key "region": invalid value "two"`},
		{"bad duration", "lease-ttl: 10\n", `key "lease-ttl": invalid value "10"`},
		{"bad bool", "debug: maybe\n", `key "debug": invalid value "maybe"`},
		{"nested", "listen: {host: x}\n", `key "listen": want a string`},
		{"null", "listen:\n", `key "listen": no value`},
		{"list of lists", "etcd: [[a]]\n", `key "etcd": list item 1`},
		{"config key", "config: other.yaml\n", `key "config": a configuration file cannot name another`},
		{"not a mapping", "- region\n", "want a mapping"},
		{"duplicate", "region: 1\nregion: 2\n", "region"},
		{"syntax", "region: [1\n", "--config"},
		{"flag-style key", "--region: 1\n", `unknown key "--region"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := writeConfig(t, tc.body)
			err := ParseFlagsWithConfig(newTestFlags().fs, []string{"--config", p})
			if !IsUsage(err) {
				t.Fatalf("err = %v, want a usage error", err)
			}
			if !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), p) {
				t.Fatalf("err = %q, want it to contain %q and the file name", err, tc.msg)
			}
		})
	}
	err := ParseFlagsWithConfig(newTestFlags().fs, []string{"--config", filepath.Join(t.TempDir(), "missing.yaml")})
	if !IsUsage(err) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if err := ParseFlagsWithConfig(newTestFlags().fs, []string{"--config", ""}); !IsUsage(err) {
		t.Fatalf("empty --config: %v", err)
	}
}

// An empty file (or comments only) sets nothing.
func TestConfigFileEmpty(t *testing.T) {
	f := newTestFlags()
	if err := ParseFlagsWithConfig(f.fs, []string{"--config", writeConfig(t, "# nothing\n")}); err != nil {
		t.Fatal(err)
	}
	if f.region != -1 || f.listen != "127.0.0.1:7070" {
		t.Fatalf("empty file changed flags: %+v", f)
	}
}

// FuzzConfigFile: whatever a --config file holds, applying it either
// fails with a usage error naming the file, or sets exactly the flags the
// file names (none ignored, none invented).
func FuzzConfigFile(f *testing.F) {
	for _, body := range []string{
		"region: 2\nlisten: 127.0.0.1:0\nlease-ttl: 20s\ndebug: true\netcd: [10.0.0.1:2379, 10.0.0.2:2379]\n",
		"region: 1\nregoin: 2\n", "region: two\n", "lease-ttl: 10\n", "debug: maybe\n", "listen: {host: x}\n",
		"listen:\n", "etcd: [[a]]\n", "config: other.yaml\n", "- region\n", "region: 1\nregion: 2\n",
		"region: [1\n", "--region: 1\n", "# nothing\n", "", "region: 0x10\n", "debug: yes\n", "region: &a 1\nlisten: *a\n",
		"listen: \"\\u0000\"\n", "etcd: []\n", "region: 1e3\n",
	} {
		f.Add([]byte(body))
	}
	const path = "fuzz.yaml"
	f.Fuzz(func(t *testing.T, body []byte) {
		fl := newTestFlags()
		err := applyConfig(fl.fs, path, body)
		if err != nil {
			if !IsUsage(err) || !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q: want a usage error naming %s", err, path)
			}
			return
		}
		vals, perr := parseConfig(body)
		if perr != nil {
			t.Fatalf("applied, but parseConfig fails: %v", perr)
		}
		var set []string
		fl.fs.Visit(func(fg *flag.Flag) { set = append(set, fg.Name) })
		if len(set) != len(vals) {
			t.Fatalf("the file names %d keys, %d flags were set (%v)", len(vals), len(set), set)
		}
		for _, name := range set {
			if _, ok := vals[name]; !ok {
				t.Fatalf("flag %s set, but the file does not name it", name)
			}
		}
	})
}
