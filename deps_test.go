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
	"github.com/cespare/xxhash/", // otel/attribute
}

// TestLibraryLinksOnlyItsOwnDependencies keeps the operator's, the tests'
// and golang-migrate's dependencies out of a service's binary: the layers
// check the schema version with a plain query (internal/schema), never
// through migrations, and never import the test harness.
func TestLibraryLinksOnlyItsOwnDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}",
		"./advisory", "./leasetable", "./fencedwrite", "./health").CombinedOutput()
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
