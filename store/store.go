package store

import (
	"context"
	"errors"
)

// Tier is the storage tier of one holder of a block. Lower tiers are faster.
type Tier uint8

const (
	TierGPU Tier = iota
	TierCPU
	TierDisk
	// NumTiers is the number of tiers a holder can be on.
	NumTiers
)

var tierNames = [...]string{"GPU", "CPU", "DISK"}

func (t Tier) String() string {
	if t < NumTiers {
		return tierNames[t]
	}
	return "INVALID"
}

// Errors every backend returns for bad input, checked with errors.Is.
var (
	// ErrInvalidPod is returned for an empty pod name.
	ErrInvalidPod = errors.New("store: empty pod name")
	// ErrInvalidTier is returned for a tier at or above NumTiers.
	ErrInvalidTier = errors.New("store: invalid tier")
)

// Store maps block keys to the pods holding them. Implementations are safe
// for concurrent use. Pod names are opaque non-empty strings (normally
// "ip:port"). Any uint64 is a valid key, 0 and 2^64-1 included.
//
// A pod holds a block when it holds it on at least one tier; a pod's block
// count is the number of distinct keys it holds. Every method first returns
// an error wrapping ctx.Err() when ctx is already done.
type Store interface {
	// Add records that pod holds keys on tier. Adding what is already held
	// changes nothing. A bounded store may forget other blocks to make room
	// (or, when no room can be made, skip keys) and counts both.
	Add(ctx context.Context, pod string, tier Tier, keys []uint64) error
	// Remove records that pod no longer holds keys on tier. Keys the pod
	// does not hold on that tier are ignored; it returns how many were removed.
	// The pod still holds a key it also holds on another tier.
	Remove(ctx context.Context, pod string, tier Tier, keys []uint64) (int, error)
	// ClearPod removes every block of pod, in time proportional to its
	// blocks. Clearing an unknown pod does nothing.
	ClearPod(ctx context.Context, pod string) error
	// Lookup walks keys from the first and reports, for every candidate pod
	// (every known pod when pods is empty; names the store does not know
	// match nothing), the longest run of leading keys the pod holds on any
	// tier. It stops as soon as no candidate still matches. One Match per pod
	// with at least one block is appended to out[:0] and returned, in no
	// particular order. An empty keys returns out[:0].
	Lookup(ctx context.Context, keys []uint64, pods []string, out []Match) ([]Match, error)
	// Pods lists the pods holding at least one block, or whose blocks a
	// bounded store forgot since they were last cleared, sorted by name,
	// with their block counts.
	Pods(ctx context.Context) ([]PodInfo, error)
}

// Chainer is a Store that can keep a chain's blocks together. AddAfter is
// Add for keys that continue a chain whose last block is parent (the
// BlockStored event's parent); its result is Add's. A store that lays
// blocks out in memory puts keys after their parent's, so that a lookup
// walking the chain reads them together.
type Chainer interface {
	AddAfter(ctx context.Context, pod string, tier Tier, parent uint64, keys []uint64) error
}

// Match is one pod's answer to a Lookup.
type Match struct {
	Pod string
	// Blocks is the length of the longest prefix of the query the pod holds.
	Blocks int
	// TierBlocks[t] counts the prefix blocks whose fastest tier on this pod
	// is t; they sum to Blocks.
	TierBlocks [NumTiers]int
	// Incomplete is set when a bounded store forgot blocks of this pod to
	// make room, or could not store some for lack of room, since the pod
	// was last cleared: the pod may hold a longer prefix than Blocks.
	Incomplete bool
}

// PodInfo describes one pod known to a store.
type PodInfo struct {
	Name string
	// Blocks is the number of distinct keys the pod holds, on any tier.
	Blocks int
	// Evicted counts the blocks of this pod a bounded store forgot to make
	// room, or could not store for lack of room, since the pod was last
	// cleared. While it is above 0 the pod's matches are Incomplete.
	Evicted int
}
