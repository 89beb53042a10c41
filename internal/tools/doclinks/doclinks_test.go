package doclinks

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// repoRoot is the repository's top directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// tracked lists the files git tracks under root that match the patterns.
func tracked(t *testing.T, root string, patterns ...string) []string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"ls-files", "--"}, patterns...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	return strings.Fields(string(out))
}

// Every link in the repository's Markdown files, and every link into the
// repository from its YAML and Go files, names a file that exists and,
// with a fragment, a heading in it.
func TestLinksResolve(t *testing.T) {
	root := repoRoot(t)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) (map[string]bool, bool) {
		if a, ok := anchors[path]; ok {
			return a, a != nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			anchors[path] = nil
			return nil, false
		}
		anchors[path] = Anchors(string(b))
		return anchors[path], true
	}
	check := func(file string, l Link) {
		target, frag, _ := strings.Cut(l.Target, "#")
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			return // another site
		}
		var path string
		switch {
		case target == "":
			path = filepath.Join(root, file) // a heading of the same file
		case strings.HasPrefix(target, "/"):
			path = filepath.Join(root, target)
		default:
			path = filepath.Join(root, filepath.Dir(file), target)
		}
		st, err := os.Stat(path)
		if err != nil {
			t.Errorf("%s:%d: link %q: %s does not exist", file, l.Line, l.Target, strings.TrimPrefix(path, root+"/"))
			return
		}
		if frag == "" {
			return
		}
		if st.IsDir() || !strings.HasSuffix(path, ".md") {
			t.Errorf("%s:%d: link %q: a fragment on a file that is not Markdown", file, l.Line, l.Target)
			return
		}
		if a, _ := anchorsOf(path); !a[frag] {
			t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", file, l.Line, l.Target, strings.TrimPrefix(path, root+"/"), frag)
		}
	}
	n := 0
	for _, f := range tracked(t, root, "*.md") {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range Links(string(b)) {
			check(f, l)
			n++
		}
	}
	for _, f := range tracked(t, root, "*.yml", "*.yaml", "*.go", "*.json") {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range RepoLinks(string(b), 1) {
			check(f, l)
			n++
		}
	}
	if n < 50 {
		t.Fatalf("only %d links found: the scan is broken", n)
	}
	t.Logf("%d links checked", n)
}

// The checker itself: a link to a missing file, to a missing heading, and
// a fine one, in a planted document.
func TestPlantedBrokenLinks(t *testing.T) {
	doc := "# Title\n\n## A section: with (punctuation)\n\n```\n## not a heading\n```\n" +
		"[ok](#a-section-with-punctuation) [bad](#not-a-heading) [file](missing.md#x)\n" +
		"runbook: https://github.com/idrange/idrange/blob/main/docs/operations/alerts.md#alert-idrangeclockrollback\n"
	a := Anchors(doc)
	if !a["title"] || !a["a-section-with-punctuation"] || a["not-a-heading"] {
		t.Fatalf("anchors %v", a)
	}
	ls := Links(doc)
	want := []string{"#a-section-with-punctuation", "#not-a-heading", "missing.md#x", "/docs/operations/alerts.md#alert-idrangeclockrollback"}
	if len(ls) != len(want) {
		t.Fatalf("links %v, want %v", ls, want)
	}
	for i, l := range ls {
		if l.Target != want[i] {
			t.Errorf("link %d: %q, want %q", i, l.Target, want[i])
		}
	}
	if d := Anchors("## Same\n## Same\n"); !d["same"] || !d["same-1"] {
		t.Fatalf("repeated headings: %v", d)
	}
}
