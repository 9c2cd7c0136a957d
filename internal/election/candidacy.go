package election

import (
	"encoding/json"
	"fmt"

	"github.com/pgbaton/pgbaton"
)

// Candidacy is how a client stands in a leasetable election, as its
// CampaignOptions set it.
type Candidacy struct {
	// Rank orders the waiting candidates when a term ends (the highest
	// first, among equals the one that waited longest); a candidate that
	// starts waiting while a leader of a lower rank leads asks it to
	// resign.
	Rank int32
	// Ineligible stands without ever leading.
	Ineligible bool
}

// CandidacyOf is the candidacy opts set; a nil option is refused.
func CandidacyOf[O ~func(*Candidacy)](opts []O) (Candidacy, error) {
	var c Candidacy
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("%w: nil CampaignOption", pgbaton.ErrInvalidArgument)
		}
		o(&c)
	}
	return c, nil
}

// meta is an election lease's metadata.
type meta struct {
	Value string `json:"value"`
	Rank  int32  `json:"rank"`
}

// Metadata is the metadata of the lease a candidate of rank waits for,
// with value published for Leader to read. The rank in it makes the lease
// an election for the database: its grants wake observers, and a
// candidate of a higher rank asks its leader to resign (0102_leasetable,
// "Elections").
func Metadata(value string, rank int32) []byte {
	// A string and an int32 always marshal (invalid UTF-8 becomes U+FFFD).
	b, _ := json.Marshal(meta{Value: value, Rank: rank})
	return b
}

// ValueOf is the value a leader published in its lease's metadata, or ""
// when there is none: metadata written by other tools may differ.
func ValueOf(metadata []byte) string {
	var m meta
	_ = json.Unmarshal(metadata, &m)
	return m.Value
}
