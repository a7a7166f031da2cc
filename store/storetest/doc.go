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
// Every change goes through Apply: the suite's helpers apply each change
// as a batch of its own, at the pod's next seq, and expect it applied.
//
// The subtests pin the edge cases of the contract: an empty query, an empty
// store, a miss in the middle of a chain or at its first key, pod filters
// that leave nothing or name unknown pods, keys 0 and 2^64-1, idempotent
// adds, removals of what is not held, tiers, Parent hints, ForgetPod, Pods
// counts, a block held by 100 pods, queries of 1,000 keys, reuse of the
// out slice, invalid input and canceled contexts. Of batches: ops applied
// in order with the Result adding them up; duplicate and lower seqs that
// change nothing and report Duplicate; the applied seq as Apply, AppliedSeq
// and Pods report it (a first batch at seq 0, jumps, 2^64-1); ForgetPod
// forgetting the seq so that seq 1 applies again; OpClear keeping the seq
// and the stale mark; an invalid op anywhere in a batch changing nothing;
// a context canceled at each point the store looks at it, after which the
// seq has not moved and applying the batch again converges. Of tokens key
// mode: pairs added with keys, blocks removed and offloaded by engine
// hash, hashes the map does not resolve counted as Unknown, a pair
// resolving only while its key is held (a block on GPU and CPU removed
// from CPU by engine hash stays on GPU and in the map), and EngineKeys'
// shape. Of pod state: stale marks in Pods and in matches, and pods
// listed for a seq or a mark alone. Of model state: the first key mode
// and the first base model win, and Models lists both. Concurrent runs
// writers (batches with clears, duplicates, engine hashes, stale marks and
// ForgetPod, each checked exactly against what the writer did), churners
// racing on shared pods, deciders racing on the same models, and readers
// (Lookup, EngineKeys, AppliedSeq, Pods, Models) at once. For stores that
// implement Bounded with a small enough capacity: the capacity is never
// exceeded, and a pod flooding the store costs only itself: the other
// pods' answers stay whole and complete, its own are marked Incomplete,
// and Pods counts its evictions until it is cleared or forgotten.
//
// # Caveats
//
// Run Concurrent under the race detector: its value is there. Loop counts
// are bounded, so it takes well under a second against the memory backend
// and a few seconds against a networked one. Capacity and FairShare are
// only checked for capacities up to MaxBoundedCapacity; run the suite a
// second time with a small capacity to exercise them. PartialFailure
// cancels through a context whose Err fails from its nth call on: a
// backend that never calls Err while applying still passes, untested.
package storetest
