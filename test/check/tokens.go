package check

import (
	"fmt"
	"sort"
)

// TokensBackwards checks that fencing tokens never go backwards in real
// time: a grant whose acquire was invoked after another grant had been
// acknowledged must have a larger token, whatever the keys (tokens come
// from one sequence). It returns one line per grant that breaks this,
// naming the largest token acknowledged before it was invoked.
func TokensBackwards(gs []Grant) []string {
	byStart := append([]Grant(nil), gs...)
	sort.Slice(byStart, func(i, j int) bool { return byStart[i].Start < byStart[j].Start })
	byInvoke := append([]Grant(nil), gs...)
	sort.Slice(byInvoke, func(i, j int) bool { return byInvoke[i].Invoke < byInvoke[j].Invoke })
	var out []string
	var maxTok int64
	var maxOf Grant
	i := 0
	for _, b := range byInvoke {
		for ; i < len(byStart) && byStart[i].Start < b.Invoke; i++ {
			if byStart[i].Token > maxTok {
				maxTok, maxOf = byStart[i].Token, byStart[i]
			}
		}
		if b.Token <= maxTok {
			out = append(out, fmt.Sprintf("p%d %s token %d invoked at %s after p%d %s token %d was granted at %s",
				b.Proc, b.Key, b.Token, Seconds(b.Invoke), maxOf.Proc, maxOf.Key, maxTok, Seconds(maxOf.Start)))
		}
	}
	return out
}
