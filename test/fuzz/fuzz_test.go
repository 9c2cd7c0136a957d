// Package fuzz holds the fuzz targets for key hashing and name validation
// (go test -fuzz); they need no database. The seed corpora under
// testdata/fuzz run with every go test, and TestCorpusMatchesSQL in package
// test checks the same inputs against pgbaton.advisory_key in PostgreSQL.
package fuzz

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory"
)

// validName is the documented rule for advisory lock names and namespaces,
// written out independently of the package's own checks.
func validName(namespace, name string) bool {
	return len(name) >= 1 && len(name) <= advisory.MaxNameLen && utf8.ValidString(name) && !strings.ContainsRune(name, 0) &&
		len(namespace) <= advisory.MaxNamespaceLen && utf8.ValidString(namespace) &&
		!strings.ContainsRune(namespace, 0) && !strings.Contains(namespace, "/")
}

// FuzzNameKey: for every valid (namespace, name), NameKey is the first 8
// bytes of SHA-256 over "namespace/name" (or the name alone), big-endian,
// and the same on every call; Name keys never panic when printed.
func FuzzNameKey(f *testing.F) {
	for _, s := range [][2]string{{"", "job:daily-export"}, {"billing", "job:daily-export"}, {"", "ä€😀"}, {"ns", "a"}, {"", "x/y"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, namespace, name string) {
		key, err := advisory.NameKey(namespace, name)
		if !validName(namespace, name) {
			return // FuzzNameValidation covers the refusals
		}
		if err != nil {
			t.Fatalf("NameKey(%q, %q): %v, want a key", namespace, name, err)
		}
		in := name
		if namespace != "" {
			in = namespace + "/" + name
		}
		sum := sha256.Sum256([]byte(in))
		if want := int64(binary.BigEndian.Uint64(sum[:8])); key != want {
			t.Fatalf("NameKey(%q, %q) = %d, want %d", namespace, name, key, want)
		}
		if again, _ := advisory.NameKey(namespace, name); again != key {
			t.Fatalf("NameKey(%q, %q) not stable: %d then %d", namespace, name, key, again)
		}
		if s := advisory.Name(name).String(); s != "name:"+name {
			t.Fatalf("Name(%q).String() = %q", name, s)
		}
	})
}

// FuzzNameValidation: NameKey refuses exactly the names and namespaces the
// documentation rules out, with pgbaton.ErrInvalidArgument.
func FuzzNameValidation(f *testing.F) {
	for _, s := range [][2]string{{"", ""}, {"a/b", "x"}, {"", "nul\x00"}, {"", "\xff\xfe"}, {"ns\x00", "x"},
		{"", strings.Repeat("n", advisory.MaxNameLen)}, {"", strings.Repeat("n", advisory.MaxNameLen+1)},
		{strings.Repeat("s", advisory.MaxNamespaceLen+1), "x"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, namespace, name string) {
		_, err := advisory.NameKey(namespace, name)
		switch valid := validName(namespace, name); {
		case valid && err != nil:
			t.Fatalf("NameKey(%q, %q) refused a valid name: %v", namespace, name, err)
		case !valid && err == nil:
			t.Fatalf("NameKey(%q, %q) accepted an invalid name", namespace, name)
		case !valid && !errors.Is(err, pgbaton.ErrInvalidArgument):
			t.Fatalf("NameKey(%q, %q): %v does not wrap ErrInvalidArgument", namespace, name, err)
		}
	})
}
