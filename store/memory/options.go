package memory

import (
	"errors"
	"flag"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

const (
	// DefaultShards is the default upper bound on the shard count.
	DefaultShards = 256
	// DefaultCapacityBlocks is the default capacity: 8Mi blocks, about
	// 128M tokens at 16 tokens a block, in about 300 to 350 MiB.
	DefaultCapacityBlocks = 1 << 23
	// MaxCapacityBlocks is the largest capacity accepted.
	MaxCapacityBlocks = 1<<31 - 1
	// maxShards is the most shards a Store can have.
	maxShards = 1 << 16
	// minShardCapacity is the smallest per-shard capacity New settles for:
	// small capacities use fewer shards than asked so that keys that do not
	// spread evenly still use most of the capacity.
	minShardCapacity = 256
)

// ErrInvalidOptions is returned by Validate and New for unusable options.
var ErrInvalidOptions = errors.New("memory: invalid options")

// Options configures a Store. Zero fields take their defaults.
type Options struct {
	// Shards is the number of independently locked stripes, a power of
	// two; small capacities get fewer (see minShardCapacity).
	Shards int
	// CapacityBlocks bounds the blocks held, counted as (pod, key) pairs:
	// the sum of Pods' block counts never exceeds it. Memory is about 37
	// bytes per block with one holder each (less per holder for blocks
	// many pods share), up to about 43 while blocks churn: dead records
	// wait for compaction.
	CapacityBlocks int
	// Registerer receives the store's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// DefaultOptions returns the options New applies to zero fields.
func DefaultOptions() Options {
	return Options{Shards: DefaultShards, CapacityBlocks: DefaultCapacityBlocks}
}

// AddFlags registers the options' flags on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	d := DefaultOptions()
	fs.IntVar(&o.CapacityBlocks, "store-capacity-blocks", d.CapacityBlocks,
		"most (pod, block) pairs the in-memory index holds; when full, pods over their fair share or cache size lose their least recently used first; about 40 bytes each")
	fs.IntVar(&o.Shards, "store-shards", d.Shards, "lock stripes of the in-memory index, a power of two")
}

func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.Shards == 0 {
		o.Shards = d.Shards
	}
	if o.CapacityBlocks == 0 {
		o.CapacityBlocks = d.CapacityBlocks
	}
	return o
}

// Validate reports whether New accepts o (after defaults).
func (o Options) Validate() error {
	o = o.withDefaults()
	if o.Shards < 1 || o.Shards > maxShards || o.Shards&(o.Shards-1) != 0 {
		return fmt.Errorf("%w: shards %d, want a power of two in [1, %d]", ErrInvalidOptions, o.Shards, maxShards)
	}
	if o.CapacityBlocks < 1 || o.CapacityBlocks > MaxCapacityBlocks {
		return fmt.Errorf("%w: capacity %d blocks, want 1 to %d", ErrInvalidOptions, o.CapacityBlocks, MaxCapacityBlocks)
	}
	return nil
}

// shards returns the shard count for o: Shards, reduced while a shard
// would get fewer than minShardCapacity blocks.
func (o Options) shards() int {
	n := o.Shards
	for n > 1 && o.CapacityBlocks/n < minShardCapacity {
		n /= 2
	}
	return n
}
