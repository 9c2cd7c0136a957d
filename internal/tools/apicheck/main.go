// Command apicheck keeps the exported API of the repository's tagged
// modules compatible with their last release.
//
// For each module folder given, it lists the exported API of the module's
// importable packages (not main, not internal, not excluded), one
// declaration a line, and compares that listing with the module's
// baseline, api/<module>.txt (api/pgbaton.txt for github.com/pgbaton/pgbaton,
// api/pgbaton-admin.txt for github.com/pgbaton/pgbaton/admin):
//
//	go run ./internal/tools/apicheck . admin gocronlock           # compare: make api-check
//	go run ./internal/tools/apicheck -update . admin gocronlock   # rewrite: make api-update
//
// A line of the baseline that is missing now is an incompatible change (a
// declaration removed, or its type, signature, value or method set
// changed) and makes apicheck fail; a new line is a compatible addition
// and is only reported. The rules follow apidiff's, written for a text
// listing in the format of Go's own api/*.txt files:
//
//   - a function, method, field or constant is its whole line: a changed
//     parameter, result or value removes the old line;
//   - an interface that users may implement (all its methods exported)
//     also has a line naming its method set, so a method added to it,
//     which breaks implementations, removes that line;
//   - a struct type that is comparable has a line saying so, so a field
//     that makes it incomparable (breaking ==) removes that line;
//   - methods are listed with the receiver they are callable on, T or *T,
//     promoted ones included.
//
// Parameter names are left out: renaming a parameter changes nothing for
// callers. Types of other packages are written with their import path.
//
// apidiff's own export data (apidiff -w) is not used as the baseline: it
// records the absolute path of every source file on the machine that
// wrote it, so it is neither reviewable nor reproducible across
// checkouts. This listing is made from the compiler's export data (go list
// -export) with the standard library's go/types alone.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

func main() {
	update := flag.Bool("update", false, "rewrite the baselines from the current code instead of comparing")
	dir := flag.String("dir", "api", "folder of the baselines")
	var exclude stringList
	flag.Var(&exclude, "exclude", "import path of a package to leave out (repeatable)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: apicheck [-update] [-dir api] [-exclude importpath]... MODULE_DIR...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	failed := false
	for _, modDir := range flag.Args() {
		ok, err := run(modDir, *dir, *update, exclude)
		if err != nil {
			fmt.Fprintf(os.Stderr, "apicheck: %s: %v\n", modDir, err)
			os.Exit(2)
		}
		failed = failed || !ok
	}
	if failed {
		fmt.Fprintln(os.Stderr, "apicheck: incompatible API changes (lines above marked -); if intended, run make api-update and see RELEASING.md")
		os.Exit(1)
	}
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// run lists the API of the module in modDir and writes or compares its
// baseline. It reports false when the comparison found an incompatible
// change.
func run(modDir, baseDir string, update bool, exclude []string) (bool, error) {
	modPath, err := modulePath(modDir)
	if err != nil {
		return false, err
	}
	lines, err := listModule(modDir, modPath, exclude)
	if err != nil {
		return false, err
	}
	file := filepath.Join(baseDir, baselineName(modPath)+".txt")
	if update {
		var b bytes.Buffer
		fmt.Fprintf(&b, "# The exported API of module %s at its last release.\n", modPath)
		fmt.Fprintf(&b, "# Written by `make api-update` (internal/tools/apicheck); `make api-check` fails\n")
		fmt.Fprintf(&b, "# when a line here is no longer true. See RELEASING.md.\n")
		for _, l := range lines {
			b.WriteString(l)
			b.WriteByte('\n')
		}
		if err := os.MkdirAll(baseDir, 0o755); err != nil {
			return false, err
		}
		if err := os.WriteFile(file, b.Bytes(), 0o644); err != nil {
			return false, err
		}
		fmt.Printf("apicheck: wrote %s (%d lines)\n", file, len(lines))
		return true, nil
	}
	old, err := readBaseline(file)
	if err != nil {
		return false, err
	}
	now := make(map[string]bool, len(lines))
	for _, l := range lines {
		now[l] = true
	}
	was := make(map[string]bool, len(old))
	var removed, added []string
	for _, l := range old {
		was[l] = true
		if !now[l] {
			removed = append(removed, l)
		}
	}
	for _, l := range lines {
		if !was[l] {
			added = append(added, l)
		}
	}
	for _, l := range removed {
		fmt.Printf("%s: incompatible: -%s\n", file, l)
	}
	for _, l := range added {
		fmt.Printf("%s: compatible:   +%s\n", file, l)
	}
	fmt.Printf("apicheck: %s: %d incompatible, %d compatible changes\n", modPath, len(removed), len(added))
	return len(removed) == 0, nil
}

// baselineName flattens a module path below github.com/pgbaton:
// pgbaton, pgbaton-admin, pgbaton-gocronlock.
func baselineName(modPath string) string {
	name := modPath
	if i := strings.Index(name, "/"); i >= 0 && strings.Contains(name[:i], ".") {
		name = name[i+1:] // the host
	}
	if i := strings.Index(name, "/"); i >= 0 {
		name = name[i+1:] // the owner
	}
	return strings.ReplaceAll(name, "/", "-")
}

func readBaseline(file string) ([]string, error) {
	f, err := os.Open(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no baseline %s: write it with make api-update", file)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		lines = append(lines, l)
	}
	return lines, sc.Err()
}

func modulePath(modDir string) (string, error) {
	data, err := os.ReadFile(filepath.Join(modDir, "go.mod"))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	return "", fmt.Errorf("no module line in %s/go.mod", modDir)
}

// listPackage is what apicheck reads of `go list -json`.
type listPackage struct {
	ImportPath string
	Name       string
	Export     string
	DepOnly    bool
	Module     *struct{ Path string }
	Error      *struct{ Err string }
}

// listModule returns the sorted API lines of the module's packages,
// loaded from the compiler's export data.
func listModule(modDir, modPath string, exclude []string) ([]string, error) {
	cmd := exec.Command("go", "list", "-e", "-export", "-deps", "-json=ImportPath,Name,Export,DepOnly,Module,Error", "./...")
	cmd.Dir = modDir
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	exports := map[string]string{}
	var targets []string
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, err
		}
		if p.Error != nil {
			return nil, fmt.Errorf("%s: %s", p.ImportPath, p.Error.Err)
		}
		exports[p.ImportPath] = p.Export
		if p.DepOnly || p.Module == nil || p.Module.Path != modPath || p.Name == "main" ||
			isInternal(p.ImportPath) || slices.Contains(exclude, p.ImportPath) {
			continue
		}
		targets = append(targets, p.ImportPath)
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file := exports[path]
		if file == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
	var lines []string
	for _, path := range targets {
		pkg, err := imp.Import(path)
		if err != nil {
			return nil, err
		}
		lines = append(lines, listPackageAPI(pkg)...)
	}
	sort.Strings(lines)
	return slices.Compact(lines), nil
}

func isInternal(path string) bool {
	return strings.HasSuffix(path, "/internal") || strings.Contains(path, "/internal/")
}

// listPackageAPI returns one line per exported declaration of pkg, each
// starting "pkg <import path>, ".
func listPackageAPI(pkg *types.Package) []string {
	qual := func(p *types.Package) string {
		if p == pkg {
			return ""
		}
		return p.Path()
	}
	w := writer{qual: qual}
	var lines []string
	emit := func(format string, args ...any) {
		lines = append(lines, "pkg "+pkg.Path()+", "+fmt.Sprintf(format, args...))
	}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch obj := obj.(type) {
		case *types.Const:
			emit("const %s %s = %s", name, w.typ(obj.Type()), obj.Val().ExactString())
		case *types.Var:
			emit("var %s %s", name, w.typ(obj.Type()))
		case *types.Func:
			emit("func %s%s", name, w.signature(obj.Type().(*types.Signature)))
		case *types.TypeName:
			lines = append(lines, w.typeDecl(pkg, obj)...)
		}
	}
	return lines
}

// typeDecl lists a type: its kind, its fields or interface methods, and
// the methods of its method set.
func (w writer) typeDecl(pkg *types.Package, obj *types.TypeName) []string {
	name := obj.Name()
	prefix := "pkg " + pkg.Path() + ", "
	if obj.IsAlias() {
		return []string{prefix + "type " + name + " = " + w.typ(types.Unalias(obj.Type()))}
	}
	named, ok := obj.Type().(*types.Named)
	if !ok {
		return []string{prefix + "type " + name + " " + w.typ(obj.Type())}
	}
	head := name + w.typeParams(named.TypeParams())
	var lines []string
	switch u := named.Underlying().(type) {
	case *types.Struct:
		lines = append(lines, prefix+"type "+head+" struct")
		if types.Comparable(named) {
			lines = append(lines, prefix+"type "+head+" struct, comparable")
		}
		for f := range u.Fields() {
			if !f.Exported() {
				continue
			}
			if f.Embedded() {
				lines = append(lines, prefix+"type "+head+" struct, embedded "+w.typ(f.Type()))
			} else {
				lines = append(lines, prefix+"type "+head+" struct, "+f.Name()+" "+w.typ(f.Type()))
			}
		}
	case *types.Interface:
		var names []string
		sealed := false
		for m := range u.Methods() {
			if !m.Exported() {
				sealed = true
				continue
			}
			names = append(names, m.Name())
			lines = append(lines, prefix+"type "+head+" interface, "+m.Name()+w.signature(m.Type().(*types.Signature)))
		}
		if sealed {
			lines = append(lines, prefix+"type "+head+" interface, unexported methods")
		} else {
			sort.Strings(names)
			lines = append(lines, prefix+"type "+head+" interface { "+strings.Join(names, ", ")+" }")
		}
		return lines // an interface's methods are listed above
	default:
		lines = append(lines, prefix+"type "+head+" "+w.typ(u))
	}
	values := types.NewMethodSet(named)
	all := types.NewMethodSet(types.NewPointer(named))
	for sel := range all.Methods() {
		m := sel.Obj()
		if !m.Exported() {
			continue
		}
		recv := "*" + name
		if values.Lookup(m.Pkg(), m.Name()) != nil {
			recv = name
		}
		lines = append(lines, prefix+"method ("+recv+") "+m.Name()+w.signature(sel.Type().(*types.Signature)))
	}
	return lines
}

// writer writes types without parameter names.
type writer struct{ qual types.Qualifier }

func (w writer) typ(t types.Type) string {
	switch t := t.(type) {
	case *types.Signature:
		return "func" + w.signature(t)
	case *types.Pointer:
		return "*" + w.typ(t.Elem())
	case *types.Slice:
		return "[]" + w.typ(t.Elem())
	case *types.Array:
		return fmt.Sprintf("[%d]%s", t.Len(), w.typ(t.Elem()))
	case *types.Map:
		return "map[" + w.typ(t.Key()) + "]" + w.typ(t.Elem())
	case *types.Chan:
		switch t.Dir() {
		case types.SendOnly:
			return "chan<- " + w.typ(t.Elem())
		case types.RecvOnly:
			return "<-chan " + w.typ(t.Elem())
		}
		return "chan " + w.typ(t.Elem())
	}
	return types.TypeString(t, w.qual)
}

func (w writer) typeParams(tps *types.TypeParamList) string {
	if tps.Len() == 0 {
		return ""
	}
	var parts []string
	for tp := range tps.TypeParams() {
		parts = append(parts, tp.Obj().Name()+" "+w.typ(tp.Constraint()))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// signature writes "[type params](params) results".
func (w writer) signature(sig *types.Signature) string {
	var b strings.Builder
	b.WriteString(w.typeParams(sig.TypeParams()))
	b.WriteString("(")
	params := sig.Params()
	for i := range params.Len() {
		if i > 0 {
			b.WriteString(", ")
		}
		t := params.At(i).Type()
		if sig.Variadic() && i == params.Len()-1 {
			b.WriteString("..." + w.typ(t.(*types.Slice).Elem()))
		} else {
			b.WriteString(w.typ(t))
		}
	}
	b.WriteString(")")
	res := sig.Results()
	switch res.Len() {
	case 0:
	case 1:
		b.WriteString(" " + w.typ(res.At(0).Type()))
	default:
		b.WriteString(" (")
		for i := range res.Len() {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(w.typ(res.At(i).Type()))
		}
		b.WriteString(")")
	}
	return b.String()
}
