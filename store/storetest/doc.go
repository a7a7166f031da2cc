// Package storetest is the conformance suite every store.Store backend
// runs, so that backends agree on the contract.
//
// # Basics
//
// A backend's test calls Run with a constructor of fresh, empty stores:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store {
//			s, err := memory.New(memory.Options{})
//			if err != nil {
//				t.Fatal(err)
//			}
//			return s
//		})
//	}
//
// The subtests pin the edge cases of the contract: an empty query, an empty
// store, a miss in the middle of a chain or at its first key, pod filters
// that leave nothing or name unknown pods, keys 0 and 2^64-1, idempotent
// adds, removals of what is not held, tiers, ClearPod, Pods counts, a block
// held by 100 pods, queries of 1,000 keys, reuse of the out slice, invalid
// input, canceled contexts, concurrent writers and readers, and, for stores
// that implement Bounded with a small enough capacity, that the capacity is
// never exceeded and that a pod flooding the store costs only itself: the
// other pods' answers stay whole and complete, its own are marked
// Incomplete, and Pods counts its evictions until it is cleared.
//
// # Caveats
//
// Run Concurrent under the race detector: its value is there. Loop counts
// are bounded, so it takes well under a second against the memory backend
// and a few seconds against a networked one. Capacity and FairShare are
// only checked for capacities up to MaxBoundedCapacity; run the suite a
// second time with a small capacity to exercise them.
package storetest
