package memory_test

import (
	"context"

	"github.com/prefixd/prefixd/store"
	"github.com/prefixd/prefixd/store/memory"
)

// applyOps applies ops to pod in a batch of their own, at the seq after
// the pod's applied seq.
func applyOps(s *memory.Store, pod string, ops ...store.Op) (store.Result, error) {
	ctx := context.Background()
	seq, ok, err := s.AppliedSeq(ctx, pod)
	if err != nil {
		return store.Result{}, err
	}
	if ok {
		seq++
	}
	return s.Apply(ctx, pod, &store.Batch{Seq: seq, Ops: ops})
}

func testAdd(s *memory.Store, pod string, tier store.Tier, keys []uint64) error {
	_, err := applyOps(s, pod, store.Op{Kind: store.OpAdd, Tier: tier, Keys: keys})
	return err
}

func testRemove(s *memory.Store, pod string, tier store.Tier, keys []uint64) (int, error) {
	res, err := applyOps(s, pod, store.Op{Kind: store.OpRemove, Tier: tier, Keys: keys})
	return res.Removed, err
}

func testClear(s *memory.Store, pod string) error {
	_, err := applyOps(s, pod, store.Op{Kind: store.OpClear})
	return err
}
