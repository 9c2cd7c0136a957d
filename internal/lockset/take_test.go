package lockset

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
)

func TestNames(t *testing.T) {
	bad := errors.New("bad name")
	check := func(n string) error {
		if n == "" {
			return bad
		}
		return nil
	}
	got, err := Names([]string{"b", "a", "B", "é", "a2"}, 5, check)
	// Byte order, PostgreSQL's COLLATE "C": upper case first, non-ASCII last.
	if err != nil || !slices.Equal(got, []string{"B", "a", "a2", "b", "é"}) {
		t.Fatalf("Names = %q, %v", got, err)
	}
	in := []string{"z", "y"}
	if _, err := Names(in, 2, check); err != nil || in[0] != "z" {
		t.Fatalf("Names sorted the caller's slice: %q, %v", in, err)
	}
	for _, c := range []struct {
		names []string
		want  string
	}{
		{nil, "a lease set must have 1 to 3 names, got 0"},
		{[]string{"a", "b", "c", "d"}, "a lease set must have 1 to 3 names, got 4"},
		{[]string{"b", "a", "b"}, `lease "b" is named twice in a lease set`},
	} {
		_, err := Names(c.names, 3, check)
		if !errors.Is(err, pgbaton.ErrInvalidArgument) || !strings.HasSuffix(err.Error(), ": "+c.want) {
			t.Errorf("Names(%q) = %v; want %q", c.names, err, c.want)
		}
	}
	if _, err := Names([]string{"a", ""}, 3, check); err != bad {
		t.Fatalf("a name check refuses: %v; want its error", err)
	}
}

type member struct {
	name string
	err  error
}

func (m *member) Err() error { return m.err }

// fakeSet grants names in one round trip up to the first one in held,
// keeping the prefix, as pgbaton.lease_attempt_all does.
type fakeSet struct {
	held   map[string]bool
	tries  [][]string
	waited []string
}

func (f *fakeSet) try(rest []string) ([]*member, string, error) {
	f.tries = append(f.tries, rest)
	var got []*member
	for _, n := range rest {
		if f.held[n] {
			return got, n, nil
		}
		got = append(got, &member{name: n})
	}
	return got, "", nil
}

func (f *fakeSet) wait(name string) (*member, error) {
	f.waited = append(f.waited, name)
	return &member{name: name}, nil
}

func namesOf(ms []*member) []string {
	var s []string
	for _, m := range ms {
		s = append(s, m.name)
	}
	return s
}

func TestTakeInOneRoundTripWhenNothingIsInTheWay(t *testing.T) {
	f := &fakeSet{}
	got, err := Take([]string{"a", "b", "c"}, f.try, f.wait)
	if err != nil || !slices.Equal(namesOf(got), []string{"a", "b", "c"}) || len(f.tries) != 1 || f.waited != nil {
		t.Fatalf("Take = %q, %v; tries %q, waited %q", namesOf(got), err, f.tries, f.waited)
	}
}

func TestTakeWaitsForEachHeldNameHoldingThoseBefore(t *testing.T) {
	f := &fakeSet{held: map[string]bool{"b": true, "d": true}}
	got, err := Take([]string{"a", "b", "c", "d", "e"}, f.try, f.wait)
	if err != nil || !slices.Equal(namesOf(got), []string{"a", "b", "c", "d", "e"}) {
		t.Fatalf("Take = %q, %v", namesOf(got), err)
	}
	// The rest after each wait goes in one round trip.
	want := fmt.Sprint([][]string{{"a", "b", "c", "d", "e"}, {"c", "d", "e"}, {"e"}})
	if fmt.Sprint(f.tries) != want || !slices.Equal(f.waited, []string{"b", "d"}) {
		t.Fatalf("tries %q, waited %q", f.tries, f.waited)
	}
	f = &fakeSet{held: map[string]bool{"c": true}}
	if got, err := Take([]string{"a", "b", "c"}, f.try, f.wait); err != nil || len(got) != 3 || len(f.tries) != 1 {
		t.Fatalf("last name held: %q, %v, tries %q", namesOf(got), err, f.tries)
	}
}

func TestTakeReturnsWhatItTookWhenItFails(t *testing.T) {
	f := &fakeSet{held: map[string]bool{"b": true}}
	ended := errors.New("ctx ended")
	got, err := Take([]string{"a", "b", "c"}, f.try, func(string) (*member, error) { return nil, ended })
	if err != ended || !slices.Equal(namesOf(got), []string{"a"}) {
		t.Fatalf("a wait failed: %q, %v; want [a] to give back", namesOf(got), err)
	}

	down := errors.New("down")
	got, err = Take([]string{"a", "b"}, func([]string) ([]*member, string, error) {
		return []*member{{name: "a"}}, "", down
	}, f.wait)
	if err != down || len(got) != 1 {
		t.Fatalf("a try failed: %q, %v", namesOf(got), err)
	}

	got, err = Take([]string{"a", "b"}, func([]string) ([]*member, string, error) { return nil, "x", nil }, f.wait)
	if err == nil || err.Error() != `the database refused "x", which the set does not name` || !slices.Equal(namesOf(got), []string{"x"}) {
		t.Fatalf("a refusal of a name not in the set: %q, %v", namesOf(got), err)
	}

	lost := errors.New("lost")
	f = &fakeSet{held: map[string]bool{"b": true}}
	got, err = Take([]string{"a", "b"}, func(rest []string) ([]*member, string, error) {
		ms, held, err := f.try(rest)
		if len(ms) > 0 {
			ms[0].err = lost // lost while b was waited for
		}
		return ms, held, err
	}, f.wait)
	if err != lost || len(got) != 2 {
		t.Fatalf("a member lost while waiting: %q, %v; want its error", namesOf(got), err)
	}
}

// The grants come first, then the name refused, if one was.
func TestAnswer(t *testing.T) {
	granted, refused := Answer([]db.LeaseAttemptAllRow{{Name: "a", Acquired: true, Token: 1}, {Name: "b", Acquired: true, Token: 2}, {Name: "c", Holder: "x"}})
	if len(granted) != 2 || granted[0].Name != "a" || granted[1].Token != 2 || refused == nil || refused.Name != "c" || refused.Holder != "x" {
		t.Fatalf("Answer = %+v, %+v", granted, refused)
	}
	if granted, refused := Answer([]db.LeaseAttemptAllRow{{Name: "a", Acquired: true}}); len(granted) != 1 || refused != nil {
		t.Fatalf("all granted: Answer = %+v, %+v", granted, refused)
	}
}
