package pgsession

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgbaton/pgbaton/internal/db"
)

// The operation table is the one definition of the operations; the
// statements in queries/advisory.sql (sqlc reads them there) must run
// the same function for the same op code.
func TestOpTableMatchesSQL(t *testing.T) {
	if want := "WHEN $1::int = 0 THEN true"; !strings.Contains(db.AdvisoryOpSQL, want) {
		t.Errorf("AdvisoryOp: no %q", want)
	}
	for op := Try; op < Lock; op++ {
		fn := ops[op].fn
		for _, want := range []string{
			fmt.Sprintf("WHEN $1::int = %d AND $2::bool THEN %s($3::int4, $4::int4)", op, fn),
			fmt.Sprintf("WHEN $1::int = %d THEN %s($5::int8)", op, fn),
		} {
			if !strings.Contains(db.AdvisoryOpSQL, want) {
				t.Errorf("AdvisoryOp: no %q", want)
			}
		}
		if one := ops[op].one; one != "" && !strings.Contains(one, "SELECT "+fn+"($1::int8) AS ok") {
			t.Errorf("the statement of its own for %s does not call %s: %s", ops[op].name, fn, one)
		}
	}
	if n := strings.Count(db.AdvisoryOpSQL, "WHEN $1::int ="); n != 1+2*int(Lock-Try) {
		t.Errorf("AdvisoryOp has %d branches, the table %d", n, 1+2*int(Lock-Try))
	}
}

func TestFastPathFunctions(t *testing.T) {
	fns := FastPathFunctions()
	if len(fns) != 2*int(numOps) || fns[Try] != "pg_try_advisory_lock(bigint)" ||
		fns[int(numOps)+int(UnlockShared)] != "pg_advisory_unlock_shared(integer, integer)" || fns[int(numOps)+int(Ping)] != "pg_backend_pid()" {
		t.Fatalf("%q", fns)
	}
	oids := make([]int64, len(fns))
	for i := range oids {
		oids[i] = int64(1000 + i)
	}
	f := NewFast(oids)
	if f.OID(Lock, false) != 1000+uint32(Lock) || f.OID(Try, true) != 1000+uint32(numOps)+uint32(Try) {
		t.Fatalf("%v", f)
	}
	if NewFast(oids[1:]) != nil {
		t.Fatal("a short list was taken")
	}
}
