package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/snowflake"
)

func runCmd(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestDecode(t *testing.T) {
	a, _ := snowflake.Compose(snowflake.MsSince(time.Now()), 3, 200, 4095)
	b, _ := snowflake.Compose(1, 0, 0, 0)
	code, out, errs := runCmd("decode", a.String(), b.String())
	if code != cli.ExitOK {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	want := a.Parts().Format(a) + "\n" + "id=4194304 time=2026-01-01T00:00:00.001Z region=0 worker=0 seq=0\n"
	if out != want {
		t.Fatalf("stdout\n%q\nwant\n%q", out, want)
	}
	if !strings.Contains(out, "region=3 worker=200 seq=4095") {
		t.Fatalf("fields missing from %q", out)
	}
}

func TestDecodeBadInput(t *testing.T) {
	future, _ := snowflake.Compose(snowflake.MsSince(time.Now().Add(48*time.Hour)), 0, 0, 1)
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{}, "no IDs"},
		{[]string{"abc"}, "not a decimal integer"},
		{[]string{"-5"}, "sign bit"},
		{[]string{"0"}, "never minted"},
		{[]string{"9223372036854775808"}, "does not fit"},
		{[]string{"12", "x"}, "not a decimal integer"},
		{[]string{future.String()}, "could not have been minted"},
	} {
		code, out, errs := runCmd(append([]string{"decode"}, tc.args...)...)
		if code != cli.ExitUsage || out != "" || !strings.Contains(errs, tc.msg) {
			t.Errorf("decode %v: exit %d, stdout %q, stderr %q; want exit 2, no output, %q", tc.args, code, out, errs, tc.msg)
		}
	}
	code, out, _ := runCmd("decode", "--allow-future", future.String())
	if code != cli.ExitOK || !strings.Contains(out, "seq=1") {
		t.Fatalf("--allow-future: exit %d out %q", code, out)
	}
}

func TestUnknownCommand(t *testing.T) {
	if code, _, errs := runCmd("frobnicate"); code != cli.ExitUsage || !strings.Contains(errs, "unknown command") {
		t.Fatalf("exit %d stderr %q", code, errs)
	}
	if code, _, _ := runCmd(); code != cli.ExitUsage {
		t.Fatalf("no args: exit %d", code)
	}
}
