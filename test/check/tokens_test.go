package check

import "testing"

// TokensBackwards bites: a grant invoked after a larger token was granted
// (on any key) is reported; overlapping acquires in any order are not.
func TestTokensBackwards(t *testing.T) {
	ok := []Grant{
		{Proc: 1, Key: "a", Token: 5, Invoke: 0, Start: 1},
		{Proc: 2, Key: "b", Token: 3, Invoke: 0, Start: 2}, // invoked before 5 was granted: any order
		{Proc: 3, Key: "a", Token: 7, Invoke: 3, Start: 4},
	}
	if got := TokensBackwards(ok); len(got) != 0 {
		t.Fatalf("concurrent acquires reported: %v", got)
	}
	bad := append(ok, Grant{Proc: 4, Key: "b", Token: 6, Invoke: 5, Start: 6}) // 7 was granted at 4
	got := TokensBackwards(bad)
	if len(got) != 1 {
		t.Fatalf("want one backwards grant, got %v", got)
	}
	t.Log(got[0])
}
