// Command apicheck guards the public Go API of this module (docs/design.md,
// "Public API"): it lists every exported feature of the public packages,
// one line each, in the style of the Go project's own api/*.txt files, and
// compares the listing with the committed baseline.
//
//	go run ./internal/tools/apicheck            # fail on incompatible changes, print additions
//	go run ./internal/tools/apicheck -update    # rewrite the baseline (an intended change)
//
// Public packages are the module's non-main packages outside internal/,
// cmd/ and api/ (generated gRPC code, whose contract is the .proto). The
// rules are cmd/api's: a line that disappears (a removed or changed
// feature) is incompatible; a new line is a compatible addition, except a
// method added to an interface that callers may implement. scripts/apicheck
// runs it; it reads compiler export data (go list -export), so it needs
// nothing beyond the go command. Its test fails when an exported feature
// of a public package names a type of an internal package, which no caller
// can name (TestNoExportedSignatureNamesAnInternalType).
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"

	"github.com/cockroachdb/errors"
)

const module = "github.com/idrange/idrange"

func main() {
	baseline := flag.String("baseline", "api/baseline.txt", "the committed API listing")
	update := flag.Bool("update", false, "rewrite the baseline with the current API")
	flag.Parse()
	if err := run(*baseline, *update, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "apicheck:", err)
		os.Exit(1)
	}
}

func run(baseline string, update bool, out io.Writer) error {
	pkgs, err := publicPackages()
	if err != nil {
		return err
	}
	cur, err := listing(pkgs)
	if err != nil {
		return err
	}
	if update {
		if err := os.WriteFile(baseline, []byte(strings.Join(cur, "\n")+"\n"), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(out, "apicheck: wrote %s: %d packages, %d features\n", baseline, len(pkgs), len(cur))
		return nil
	}
	data, err := os.ReadFile(baseline)
	if err != nil {
		return errors.Newf("read baseline (create it with scripts/apicheck -update): %w", err)
	}
	old := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	removed, added, broken := compare(old, cur)
	for _, l := range added {
		fmt.Fprintln(out, "+", l)
	}
	for _, l := range removed {
		fmt.Fprintln(out, "-", l)
	}
	switch {
	case len(removed)+len(broken) > 0:
		for _, l := range broken {
			fmt.Fprintln(out, "! method added to an implementable interface:", l)
		}
		return errors.Newf("%d incompatible change(s) to the public API (- lines, ! lines); if intended, run scripts/apicheck -update and commit %s",
			len(removed)+len(broken), baseline)
	case len(added) > 0:
		fmt.Fprintf(out, "apicheck: %d compatible addition(s) (+ lines); run scripts/apicheck -update and commit %s to accept them\n", len(added), baseline)
	default:
		fmt.Fprintf(out, "apicheck: public API unchanged (%d packages, %d features)\n", len(pkgs), len(cur))
	}
	return nil
}

// compare returns the lines only in old, the lines only in cur, and the
// added lines that break implementers: new methods of an interface that
// existed before and has no unexported method.
func compare(old, cur []string) (removed, added, broken []string) {
	inOld := map[string]bool{}
	for _, l := range old {
		inOld[l] = true
	}
	inCur := map[string]bool{}
	for _, l := range cur {
		inCur[l] = true
		if !inOld[l] {
			added = append(added, l)
		}
	}
	for _, l := range old {
		if !inCur[l] {
			removed = append(removed, l)
		}
	}
	for _, l := range added {
		head, _, ok := strings.Cut(l, " interface, ")
		if ok && inOld[head+" interface"] && !inOld[head+" interface, unexported methods"] {
			broken = append(broken, l)
		}
	}
	return removed, added, broken
}

func goList(args ...string) ([]byte, error) {
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, errors.Newf("go list %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// publicPackages lists the module's packages that are public API.
func publicPackages() ([]string, error) {
	// Test-only packages (examples/python's runner) export nothing.
	out, err := goList("-f", `{{if and (ne .Name "main") .GoFiles}}{{.ImportPath}}{{end}}`, module+"/...")
	if err != nil {
		return nil, err
	}
	var pkgs []string
	for _, p := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(p, module+"/")
		if rel == "internal" || strings.HasPrefix(rel, "internal/") || strings.Contains(rel, "/internal/") ||
			strings.HasSuffix(rel, "/internal") || strings.HasPrefix(rel, "cmd/") || strings.HasPrefix(rel, "api/") {
			continue
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}

// listing type-checks nothing itself: it imports the packages from the
// compiler's export data and prints their exported features, sorted.
func listing(pkgs []string) ([]string, error) {
	out, err := goList(append([]string{"-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}"}, pkgs...)...)
	if err != nil {
		return nil, err
	}
	exports := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if path, file, ok := strings.Cut(sc.Text(), "\t"); ok && file != "" {
			exports[path] = file
		}
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok {
			return nil, errors.Newf("no export data for %s", path)
		}
		return os.Open(f)
	})
	var lines []string
	for _, path := range pkgs {
		p, err := imp.Import(path)
		if err != nil {
			return nil, errors.Newf("import %s: %w", path, err)
		}
		lines = append(lines, features(p)...)
	}
	slices.Sort(lines)
	return slices.Compact(lines), nil
}

// features lists one package's exported features, one line each.
func features(p *types.Package) []string {
	rel := strings.TrimPrefix(p.Path(), module+"/")
	qf := func(q *types.Package) string {
		if q == p {
			return ""
		}
		return strings.Replace(q.Path(), module+"/", "", 1)
	}
	var lines []string
	add := func(format string, args ...any) {
		lines = append(lines, "pkg "+rel+", "+fmt.Sprintf(format, args...))
	}
	sc := p.Scope()
	for _, name := range sc.Names() {
		obj := sc.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch o := obj.(type) {
		case *types.Const:
			add("const %s %s = %s", o.Name(), types.TypeString(o.Type(), qf), o.Val().ExactString())
		case *types.Var:
			add("var %s %s", o.Name(), types.TypeString(o.Type(), qf))
		case *types.Func:
			add("func %s%s", o.Name(), sigString(o.Type().(*types.Signature), qf))
		case *types.TypeName:
			typeFeatures(o, qf, add)
		}
	}
	return lines
}

func typeFeatures(o *types.TypeName, qf types.Qualifier, add func(string, ...any)) {
	if o.IsAlias() {
		add("type %s = %s", o.Name(), types.TypeString(types.Unalias(o.Type()), qf))
		return
	}
	named, ok := o.Type().(*types.Named)
	if !ok {
		add("%s", types.ObjectString(o, qf))
		return
	}
	decl := o.Name()
	if tp := named.TypeParams(); tp.Len() > 0 {
		decl = types.TypeString(named, qf) // Name[T constraint]
	}
	switch u := named.Underlying().(type) {
	case *types.Struct:
		add("type %s struct", decl)
		for i := 0; i < u.NumFields(); i++ {
			f := u.Field(i)
			switch {
			case f.Embedded() && (f.Exported() || hasExportedMembers(f.Type())):
				add("type %s struct, embedded %s", decl, types.TypeString(f.Type(), qf))
			case f.Exported():
				add("type %s struct, %s %s", decl, f.Name(), types.TypeString(f.Type(), qf))
			}
		}
	case *types.Interface:
		add("type %s interface", decl)
		unexported := false
		for i := 0; i < u.NumMethods(); i++ {
			m := u.Method(i)
			if !m.Exported() {
				unexported = true
				continue
			}
			add("type %s interface, %s%s", decl, m.Name(), sigString(m.Type().(*types.Signature), qf))
		}
		if unexported {
			add("type %s interface, unexported methods", decl)
		}
		if !u.IsMethodSet() {
			add("type %s interface, constraint %s", decl, types.TypeString(u, qf))
		}
	default:
		add("type %s %s", decl, types.TypeString(u, qf))
	}
	for i := 0; i < named.NumMethods(); i++ {
		m := named.Method(i)
		if !m.Exported() {
			continue
		}
		sig := m.Type().(*types.Signature)
		recv := o.Name()
		if _, ptr := sig.Recv().Type().(*types.Pointer); ptr {
			recv = "*" + recv
		}
		add("method (%s) %s%s", recv, m.Name(), sigString(sig, qf))
	}
}

// sigString is a signature without parameter names (renaming a parameter
// is not an API change), with its type parameters.
func sigString(sig *types.Signature, qf types.Qualifier) string {
	var b strings.Builder
	if tp := sig.TypeParams(); tp.Len() > 0 {
		b.WriteString("[")
		for i := 0; i < tp.Len(); i++ {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(tp.At(i).Obj().Name() + " " + types.TypeString(tp.At(i).Constraint(), qf))
		}
		b.WriteString("]")
	}
	tuple := func(t *types.Tuple, variadic bool) string {
		parts := make([]string, t.Len())
		for i := range parts {
			typ := t.At(i).Type()
			if variadic && i == t.Len()-1 {
				parts[i] = "..." + types.TypeString(typ.(*types.Slice).Elem(), qf)
			} else {
				parts[i] = types.TypeString(typ, qf)
			}
		}
		return strings.Join(parts, ", ")
	}
	b.WriteString("(" + tuple(sig.Params(), sig.Variadic()) + ")")
	switch r := sig.Results(); r.Len() {
	case 0:
	case 1:
		b.WriteString(" " + tuple(r, false))
	default:
		b.WriteString(" (" + tuple(r, false) + ")")
	}
	return b.String()
}

// hasExportedMembers: an unexported embedded type still promotes its
// exported fields and methods.
func hasExportedMembers(t types.Type) bool {
	ms := types.NewMethodSet(types.NewPointer(t))
	for i := 0; i < ms.Len(); i++ {
		if ms.At(i).Obj().Exported() {
			return true
		}
	}
	if s, ok := t.Underlying().(*types.Struct); ok {
		for i := 0; i < s.NumFields(); i++ {
			if s.Field(i).Exported() {
				return true
			}
		}
	}
	return false
}
