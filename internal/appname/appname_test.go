package appname

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestOf(t *testing.T) {
	if got := Of("advisory", "host:1"); got != "pgbaton advisory host:1" {
		t.Fatalf("Of = %q", got)
	}
	long := Of("lease listener", strings.Repeat("é", 40))
	if len(long) > maxLen || !utf8.ValidString(long) {
		t.Fatalf("Of = %q (%d bytes): want at most %d bytes of valid UTF-8", long, len(long), maxLen)
	}
}
