package blockhash

import "fmt"

// checkMM checks that items are in increasing offset order, disjoint, with
// offsets >= 0 and lengths >= 1. vLLM (_gen_mm_extra_hash_keys) and llm-d
// (ComputeBlockExtraFeatures) assign items to blocks alike only then.
func checkMM(mm []MMItem) error {
	end := 0
	for i, it := range mm {
		if it.Length < 1 {
			return fmt.Errorf("%w: item %d has length %d, want >= 1", ErrMultimodal, i, it.Length)
		}
		if it.Offset < end {
			return fmt.Errorf("%w: item %d starts at token %d, want >= %d (sorted, disjoint, not negative)", ErrMultimodal, i, it.Offset, end)
		}
		end = it.Offset + it.Length
	}
	return nil
}

// mmRange returns the items of mm, checked by checkMM, that overlap the
// tokens [start, end): mm[lo2:hi]. lo is where the previous block's range
// began; blocks must be visited in increasing order.
func mmRange(mm []MMItem, lo, start, end int) (lo2, hi int) {
	for lo < len(mm) && mm[lo].Offset+mm[lo].Length <= start {
		lo++
	}
	hi = lo
	for hi < len(mm) && mm[hi].Offset < end {
		hi++
	}
	return lo, hi
}
