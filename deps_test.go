package pgbaton_test

import (
	"os/exec"
	"strings"
	"testing"
)

// libraryDeps are the only modules (besides the standard library and this
// one) that the three layers and health may link: what a service gets in
// its binary when it imports them.
var libraryDeps = []string{
	"github.com/jackc/",
	"golang.org/x/sync/",
	"golang.org/x/text/",
	"go.opentelemetry.io/otel/attribute",
	"go.opentelemetry.io/otel/metric",
	"go.opentelemetry.io/otel/trace", // spans, off without a TracerProvider
	"go.opentelemetry.io/otel/codes",
	"go.opentelemetry.io/otel/semconv/", // otel/trace's
	"github.com/cespare/xxhash/",        // otel/attribute
}

// TestLibraryLinksOnlyItsOwnDependencies keeps the operator's, the tests'
// and golang-migrate's dependencies out of a service's binary: the layers
// check the schema version with a plain query (internal/schema), never
// through migrations, and never import the test harness.
func TestLibraryLinksOnlyItsOwnDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}",
		".", "./advisory", "./leasetable", "./fencedwrite", "./health", "./jobs", "./retention", "./databasesql", "./pgbatontest").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var bad []string
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/pgbaton/pgbaton") {
			if strings.Contains(pkg, "/internal/testkit") || strings.HasSuffix(pkg, "/migrations") {
				bad = append(bad, pkg)
			}
			continue
		}
		allowed := false
		for _, prefix := range libraryDeps {
			allowed = allowed || strings.HasPrefix(pkg, prefix)
		}
		// No database/sql driver, not even pgx's: package databasesql
		// adapts the caller's *sql.Tx without one.
		allowed = allowed && pkg != "github.com/jackc/pgx/v5/stdlib"
		if !allowed {
			bad = append(bad, pkg)
		}
	}
	if len(bad) > 0 {
		t.Errorf("the library links packages a service should not get:\n  %s", strings.Join(bad, "\n  "))
	}
}

// TestOnlyTestsImportTheHarness: outside internal/testkit itself, no
// non-test package of this module (migrations, internal/db, ...) imports
// the test harness; only _test files and the other modules do.
func TestOnlyTestsImportTheHarness(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}: {{join .Imports \" \"}}", "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const harness = "github.com/pgbaton/pgbaton/internal/testkit"
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, ": ")
		if strings.HasPrefix(pkg, harness) {
			continue
		}
		for _, imp := range strings.Fields(imports) {
			if strings.HasPrefix(imp, harness) {
				t.Errorf("%s imports the test harness %s", pkg, imp)
			}
		}
	}
}

// layers ranks the module's packages, lowest first; a package is ranked
// by the longest entry that is its path or a folder above it. A package
// imports only packages of a lower rank, or of its own entry (internal
// helpers among themselves, a module's own subpackages). The order is the
// docs': the root's shared errors and interfaces, the internal helpers,
// the migrations (imported only by the test harness and the tools) and
// beside them the database/sql adapter (which the layers import for
// fencedwrite.InSQLTx, and the test harness may), the three layers in
// the order of the README, then what is built on them: health, jobs (job
// runs and cron slots over leasetable and fencedwrite), retention
// (pruning every layer's tables), and the modules a library user never
// imports.
var layers = []struct {
	pkg  string // path below the module, "" for the root
	rank int
}{
	{"", 0},
	{"internal", 1},
	{"migrations", 2},
	{"databasesql", 2},
	{"internal/testkit", 3},
	{"advisory", 4},
	{"leasetable", 5},
	{"fencedwrite", 6},
	{"health", 7},
	{"jobs", 8},
	{"retention", 9},
	{"pgbatontest", 9}, // the test kit: faults on leases, for users' tests
	{"gocronlock", 10},
	{"admin", 11},
	{"cmd/pgbaton", 12},
	{"examples", 13},
	{"bench", 13},
	{"test", 13},
}

// layerOf is the entry of layers that ranks pkg, or -1.
func layerOf(pkg string) int {
	const module = "github.com/pgbaton/pgbaton"
	rel, ok := strings.CutPrefix(pkg, module)
	if !ok || rel != "" && rel[0] != '/' {
		return -1
	}
	rel = strings.TrimPrefix(rel, "/")
	best := -1
	for i, l := range layers {
		if (rel == l.pkg || l.pkg == "" || strings.HasPrefix(rel, l.pkg+"/")) &&
			(best < 0 || len(l.pkg) > len(layers[best].pkg)) {
			best = i
		}
	}
	return best
}

// TestImportsGoDownward fails when a package of any of the repository's
// modules imports one ranked above it in layers (test files aside: an
// example may use every layer), or when a package has no rank yet.
func TestImportsGoDownward(t *testing.T) {
	// Every module of the workspace (go.work), each with its packages.
	mods, err := exec.Command("go", "list", "-m", "-f", "{{.Path}}/...").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	args := append([]string{"list", "-f", "{{.ImportPath}}: {{join .Imports \" \"}}"}, strings.Fields(string(mods))...)
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, ":")
		from := layerOf(pkg)
		if from < 0 {
			t.Errorf("%s has no rank: add it to layers", pkg)
			continue
		}
		for _, imp := range strings.Fields(imports) {
			to := layerOf(imp)
			if to < 0 || to == from {
				continue // another module's, or its own entry's
			}
			if layers[to].rank >= layers[from].rank {
				t.Errorf("%s (rank %d) imports %s (rank %d): imports go to lower ranks only",
					pkg, layers[from].rank, imp, layers[to].rank)
			}
		}
	}
}
