package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idrange/idrange/internal/testing/testenv"
)

// The README's openssl example works as written: its openssl commands make
// a CA, a server certificate and two client certificates; its serve
// command serves mutual TLS with them (on test ports) and its mint command
// mints with minter-a's certificate.
func TestREADMEOpenSSLExample(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess test: skipped with -short")
	}
	for _, tool := range []string{"openssl", "bash"} {
		testenv.LookTool(t, tool, "the README's example runs it; install it (Debian: apt-get install "+tool+"; .ci/run installs openssl)")
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "A working example with openssl")
	if !ok {
		t.Fatal("README has no openssl example")
	}
	_, rest, _ = strings.Cut(rest, "```sh\n")
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("README's openssl example is not a closed sh block")
	}
	script, cmds, ok := strings.Cut(block, "rangesvc serve ")
	if !ok {
		t.Fatal("README's openssl example has no rangesvc serve command")
	}
	serveLine, rest, _ := strings.Cut(strings.ReplaceAll(cmds, "\\\n", " "), "\n")
	mintLine, _, _ := strings.Cut(rest, "\n")

	dir := t.TempDir()
	sh := exec.Command("bash", "-euo", "pipefail", "-c", script)
	sh.Dir = dir
	if out, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("the openssl commands failed: %v\n%s", err, out)
	}

	serveArgs := words(t, strings.TrimSuffix(strings.TrimSpace(serveLine), "&"))
	if len(serveArgs) < 2 || serveArgs[0] != "--region" || serveArgs[1] != "2" {
		t.Fatalf("serve line %q: want --region 2 first", serveLine)
	}
	for i, a := range serveArgs {
		if strings.HasSuffix(a, ".crt") || strings.HasSuffix(a, ".key") {
			serveArgs[i] = filepath.Join(dir, a)
		}
	}
	srv := testenv.StartServe(t, testenv.ServeConfig{Region: 2, Args: serveArgs[2:]})
	if !strings.Contains(srv.Stderr(), "serving mutual TLS") {
		t.Fatalf("serve does not say it serves mutual TLS:\n%s", srv.Stderr())
	}

	mintArgs, ok := strings.CutPrefix(strings.TrimSpace(mintLine), "rangesvc mint ")
	if !ok {
		t.Fatalf("the line after serve is not a mint command: %q", mintLine)
	}
	args := words(t, strings.ReplaceAll(mintArgs, "127.0.0.1:7070", srv.GRPCAddr))
	for i, a := range args {
		if strings.HasSuffix(a, ".crt") || strings.HasSuffix(a, ".key") {
			args[i] = filepath.Join(dir, a)
		}
	}
	code, out, errs := mintCmd(t, args...)
	if code != 0 || len(strings.Fields(out)) != 3 {
		t.Fatalf("README's mint: exit %d, stdout %q, stderr %s", code, out, errs)
	}
	// The same mint without a client certificate is refused.
	code, out, _ = mintCmd(t, "--target", srv.GRPCAddr, "-n", "1", "--timeout", "3s", "--tls-ca", filepath.Join(dir, "ca.crt"))
	if code != 1 || out != "" {
		t.Fatalf("mint without a client certificate: exit %d, stdout %q", code, out)
	}
}

// words splits a shell command line on spaces, honouring single quotes
// (all the README's commands use).
func words(t *testing.T, line string) []string {
	t.Helper()
	var out []string
	for i, part := range strings.Split(line, "'") {
		if i%2 == 1 {
			out = append(out, part)
			continue
		}
		out = append(out, strings.Fields(part)...)
	}
	if strings.Count(line, "'")%2 != 0 {
		t.Fatalf("unbalanced quote in %q", line)
	}
	return out
}
