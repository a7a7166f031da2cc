package memory

import (
	"context"

	"github.com/prefixd/prefixd/store"
)

// applyOps applies ops to pod in a batch of their own, at the seq after
// the pod's applied seq.
func applyOps(s *Store, pod string, ops ...store.Op) (store.Result, error) {
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

func testAdd(s *Store, pod string, tier store.Tier, keys []uint64) error {
	_, err := applyOps(s, pod, store.Op{Kind: store.OpAdd, Tier: tier, Keys: keys})
	return err
}

func testAddAfter(s *Store, pod string, tier store.Tier, parent uint64, keys []uint64) error {
	_, err := applyOps(s, pod, store.Op{Kind: store.OpAdd, Tier: tier, Keys: keys, Parent: parent, HasParent: true})
	return err
}

func testRemove(s *Store, pod string, tier store.Tier, keys []uint64) (int, error) {
	res, err := applyOps(s, pod, store.Op{Kind: store.OpRemove, Tier: tier, Keys: keys})
	return res.Removed, err
}

func testClear(s *Store, pod string) error {
	_, err := applyOps(s, pod, store.Op{Kind: store.OpClear})
	return err
}
