package names

import (
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestOwner(t *testing.T) {
	a, b := Owner(255), Owner(255)
	if a == b || !strings.Contains(a, fmt.Sprintf(":%d:", os.Getpid())) || Problem("owner", a, 255) != "" {
		t.Errorf("Owner = %q, then %q; want a unique, valid hostname:pid:random", a, b)
	}
	// Cut to its last bytes: the random part's, hex.
	if short := Owner(10); len(short) != 10 {
		t.Errorf("Owner(10) = %q; want 10 bytes", short)
	} else if _, err := hex.DecodeString(short); err != nil {
		t.Errorf("Owner(10) = %q; want the end of the random part", short)
	}
}
