package store

import "context"

// Tier is the storage tier of one holder of a block. Lower tiers are faster.
type Tier uint8

const (
	TierGPU Tier = iota
	TierCPU
	TierDisk
	// NumTiers is the number of tiers a holder can be on.
	NumTiers
)

// Store maps block keys to the pods holding them. Implementations are safe
// for concurrent use. Pod names are opaque strings (normally "ip:port").
type Store interface {
	// Add records that pod holds keys on tier.
	Add(ctx context.Context, pod string, tier Tier, keys []uint64) error
	// Remove records that pod no longer holds keys on tier. Keys the pod
	// does not hold on that tier are ignored; it returns how many were removed.
	Remove(ctx context.Context, pod string, tier Tier, keys []uint64) (int, error)
	// ClearPod removes every block of pod, in time proportional to its blocks.
	ClearPod(ctx context.Context, pod string) error
	// Lookup walks keys from the first and reports, for every candidate pod
	// (every known pod when pods is empty), the longest run of leading keys
	// the pod holds on any tier. It stops as soon as no candidate still
	// matches. One Match per pod with at least one block is appended to
	// out[:0] and returned, in no particular order.
	Lookup(ctx context.Context, keys []uint64, pods []string, out []Match) ([]Match, error)
	// Pods lists the known pods with their block counts.
	Pods(ctx context.Context) ([]PodInfo, error)
}

// Match is one pod's answer to a Lookup.
type Match struct {
	Pod string
	// Blocks is the length of the longest prefix of the query the pod holds.
	Blocks int
	// TierBlocks[t] counts the prefix blocks whose fastest tier on this pod is t.
	TierBlocks [NumTiers]int
}

// PodInfo describes one pod known to a store.
type PodInfo struct {
	Name   string
	Blocks int
}
