package sqlbase

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// mergeNewest, on walks of two random id sets cut at n each, answers the
// newest n ids of their union, and says whether more may follow, as the
// lookup by provider refund id needs to page without gaps or repeats.
func TestMergeNewestIsTheUnionsNewest(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	walk := func(set []int64, n int) []int64 { return set[:min(n, len(set))] }
	for round := 0; round < 2000; round++ {
		var a, b, union []int64
		for id := int64(40); id > 0; id-- {
			inA, inB := r.IntN(3) == 0, r.IntN(4) == 0
			if inA {
				a = append(a, id)
			}
			if inB {
				b = append(b, id)
			}
			if inA || inB {
				union = append(union, id)
			}
		}
		n := 1 + r.IntN(6)
		got, more := mergeNewest(walk(a, n), walk(b, n), n)
		want := walk(union, n)
		if !slices.Equal(got, want) {
			t.Fatalf("mergeNewest(%v, %v, %d) = %v, want %v (of %v)", walk(a, n), walk(b, n), n, got, want, union)
		}
		// more may be true when nothing follows (a walk cut exactly at its
		// end), never false when something does.
		if !more && len(union) > len(got) {
			t.Fatalf("mergeNewest(%v, %v, %d) says nothing follows %v; %v does", walk(a, n), walk(b, n), n, got,
				union[len(got):])
		}
	}
}
