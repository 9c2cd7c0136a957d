package election

import (
	"errors"
	"testing"

	"github.com/pgbaton/pgbaton"
)

type option func(*Candidacy)

func TestCandidacyOf(t *testing.T) {
	c, err := CandidacyOf([]option{func(c *Candidacy) { c.Rank = 1 }, func(c *Candidacy) { c.Rank = 7 }, func(c *Candidacy) { c.Ineligible = true }})
	if err != nil || c != (Candidacy{Rank: 7, Ineligible: true}) {
		t.Fatalf("CandidacyOf = %+v, %v; want the options applied in order", c, err)
	}
	if c, err := CandidacyOf[option](nil); err != nil || c != (Candidacy{}) {
		t.Fatalf("no options: %+v, %v; want rank 0, eligible", c, err)
	}
	if _, err := CandidacyOf([]option{nil}); !errors.Is(err, pgbaton.ErrInvalidArgument) || err.Error() != pgbaton.ErrInvalidArgument.Error()+": nil CampaignOption" {
		t.Fatalf("nil option: %v; want an invalid argument", err)
	}
}

func TestMetadata(t *testing.T) {
	// The database reads the rank from this key (0102_leasetable).
	if got := string(Metadata("10.0.0.1:80", -3)); got != `{"value":"10.0.0.1:80","rank":-3}` {
		t.Fatalf("Metadata = %s", got)
	}
	if got := ValueOf(Metadata("a\x00b", 0)); got != "a\x00b" {
		t.Fatalf("ValueOf(Metadata(v)) = %q", got)
	}
	for _, m := range []string{"", "null", "not json", `{"rank":2}`, `[1]`} {
		if got := ValueOf([]byte(m)); got != "" {
			t.Fatalf("ValueOf(%q) = %q; want empty: metadata other tools wrote", m, got)
		}
	}
	if got := ValueOf([]byte(`{"value":"x","rank":"high","other":1}`)); got != "x" {
		t.Fatalf("ValueOf with a foreign rank = %q; want the value", got)
	}
}
