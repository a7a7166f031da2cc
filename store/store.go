package store

import (
	"context"
	"errors"
	"fmt"
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
	// ErrInvalidBatch is returned for a batch with an op of an unknown
	// kind, or Engine neither empty nor as long as Keys.
	ErrInvalidBatch = errors.New("store: invalid batch")
	// ErrInvalidName is returned for an empty model or adapter name, or a
	// key mode other than "engine" and "tokens".
	ErrInvalidName = errors.New("store: invalid model state")
	// ErrNotOwner is returned by Apply (and ForgetPod) of a store shared
	// by several prefixd processes when another process holds the pod's
	// write lease: it applies the pod's stream, and nothing changed. A lease
	// lapses when its holder applies nothing of the pod for the store's
	// lease time; the next process to apply a batch of the pod takes it.
	// Stores of one process never return it.
	ErrNotOwner = errors.New("store: another prefixd process applies this pod's events")
	// ErrUnavailable wraps the errors of a networked store that cannot be
	// reached, or did not answer within the call's deadline.
	ErrUnavailable = errors.New("store: unavailable")
)

// Key modes as ModelState.KeyMode and DecideKeyMode spell them.
const (
	KeyModeEngine = "engine"
	KeyModeTokens = "tokens"
)

// Store maps block keys to the pods holding them, and keeps what several
// prefixd processes sharing one store must agree on: each pod's applied
// seq, stale mark and engine-hash map, and each model's key mode and LoRA
// adapters. Implementations are safe for concurrent use. Pod, model and
// adapter names are opaque non-empty strings (a pod is normally
// "ip:port"). Any uint64 is a valid key, 0 and 2^64-1 included.
//
// A pod holds a block when it holds it on at least one tier; a pod's block
// count is the number of distinct keys it holds. Every method first returns
// an error wrapping ctx.Err() when ctx is already done.
//
// # Batches and the applied seq
//
// A pod's blocks change only through Apply, one batch at a time, and
// ForgetPod (and a bounded store's evictions): the batch's ops in order,
// then "applied through Seq" recorded for the pod. That number is what
// gap detection, replay, restarts and other prefixd replicas resume from;
// Apply's Result, AppliedSeq and Pods report it. A batch whose Seq is at
// or below the pod's applied seq is a duplicate (a replay overlapping
// what was applied, or another replica that applied it first) and changes
// nothing; a pod's first batch applies whatever its Seq. Batches of one
// pod apply one at a time: the check, the ops and the new seq are one
// step for the pod. A batch is checked whole before any of it applies: a
// batch with an invalid op changes nothing. A batch that fails part way
// (a canceled context, a lost connection) does not move the applied seq,
// and is applied again from there; its ops are idempotent (adding what is
// held, removing what is not), so applying it again converges. A reader
// may see part of a batch applied.
type Store interface {
	// Apply applies pod's batch b and records b.Seq as its applied seq,
	// or, when b.Seq is at or below the applied seq, changes nothing and
	// reports Duplicate.
	Apply(ctx context.Context, pod string, b *Batch) (Result, error)
	// AppliedSeq returns pod's applied seq, and false when the pod has
	// none (never applied a batch, or forgotten since).
	AppliedSeq(ctx context.Context, pod string) (seq uint64, ok bool, err error)
	// ForgetPod removes every block of pod, its engine-hash map, applied
	// seq and stale mark, in time proportional to its blocks: the pod is
	// as if never seen (its engine restarted, or it left the fleet).
	// Forgetting an unknown pod does nothing.
	ForgetPod(ctx context.Context, pod string) error
	// SetStale marks pod as stale (its events are known to be incomplete:
	// a gap nothing filled) or consistent again. Marking an unknown pod
	// stale makes it known.
	SetStale(ctx context.Context, pod string, stale bool) error
	// EngineKeys looks up engine hashes in pod's engine-hash map (see
	// Op.Engine) and appends, for each hash, its key and whether the map
	// resolves it (the pod holds the key), to keys[:0] and found[:0]; the
	// key is 0 when it does not.
	EngineKeys(ctx context.Context, pod string, hashes []uint64, keys []uint64, found []bool) ([]uint64, []bool, error)
	// Lookup walks keys from the first and reports, for every candidate pod
	// (every known pod when pods is empty; names the store does not know
	// match nothing), the longest run of leading keys the pod holds on any
	// tier. It stops as soon as no candidate still matches. One Match per pod
	// with at least one block is appended to out[:0] and returned, in no
	// particular order. An empty keys returns out[:0].
	Lookup(ctx context.Context, keys []uint64, pods []string, out []Match) ([]Match, error)
	// Pods lists the pods the store knows, sorted by name: those holding
	// a block, with an applied seq, marked stale, or whose blocks a
	// bounded store forgot since they were last cleared.
	Pods(ctx context.Context) ([]PodInfo, error)

	// Models returns the state of every model some process decided or
	// taught the store, by name.
	Models(ctx context.Context) (map[string]ModelState, error)
	// DecideKeyMode records mode ("engine" or "tokens") as model's key
	// mode unless one is recorded already, and returns the recorded one:
	// the first process to decide decides for all.
	DecideKeyMode(ctx context.Context, model, mode string) (string, error)
	// AddLoRA records that adapter is served on top of base unless the
	// adapter is recorded already, and returns the recorded base.
	AddLoRA(ctx context.Context, adapter, base string) (string, error)
}

// Batch is one pod's batch of changes, applied whole by Store.Apply.
type Batch struct {
	// Seq is the publisher's sequence number of the batch.
	Seq uint64
	Ops []Op
}

// Validate checks a batch whole, as every Store does before any of it
// applies: each op of a known kind, on a valid tier, Engine empty or as
// long as Keys, a clear naming no blocks.
func (b *Batch) Validate() error {
	if b == nil {
		return fmt.Errorf("%w: no batch", ErrInvalidBatch)
	}
	for i := range b.Ops {
		op := &b.Ops[i]
		switch op.Kind {
		case OpAdd, OpRemove:
			if op.Tier >= NumTiers {
				return fmt.Errorf("%w: op %d (%v): tier %d, want below %d", ErrInvalidTier, i, op.Kind, op.Tier, NumTiers)
			}
			if len(op.Keys) > 0 && len(op.Engine) > 0 && len(op.Engine) != len(op.Keys) {
				return fmt.Errorf("%w: op %d (%v): %d engine hashes for %d keys", ErrInvalidBatch, i, op.Kind, len(op.Engine), len(op.Keys))
			}
		case OpClear:
			if len(op.Keys) > 0 || len(op.Engine) > 0 {
				return fmt.Errorf("%w: op %d (clear): %d keys and %d engine hashes, want none", ErrInvalidBatch, i, len(op.Keys), len(op.Engine))
			}
		default:
			return fmt.Errorf("%w: op %d: unknown kind %d", ErrInvalidBatch, i, op.Kind)
		}
	}
	return nil
}

// OpKind says what an Op does.
type OpKind uint8

const (
	// OpAdd records that the pod holds blocks on Tier.
	OpAdd OpKind = iota + 1
	// OpRemove records that the pod no longer holds blocks on Tier; it
	// still holds a block it holds on another tier.
	OpRemove
	// OpClear removes every block of the pod and its engine-hash map; its
	// applied seq and stale mark stay. It names no blocks: Keys and Engine
	// are empty.
	OpClear
)

func (k OpKind) String() string {
	switch k {
	case OpAdd:
		return "add"
	case OpRemove:
		return "remove"
	case OpClear:
		return "clear"
	}
	return "invalid"
}

// Op is one change of a Batch.
//
// Blocks are named by index key (Keys) or by engine hash (Engine). In
// engine key mode the engine's hashes are the keys, and Engine is unused.
// In tokens key mode an OpAdd gives both, Engine[i] the engine hash of
// Keys[i], and the store records the pair in the pod's engine-hash map (a
// hash recorded again takes its new key); an OpAdd or OpRemove with
// Engine and no Keys names blocks by engine hash, resolved through that
// map (a CPU offload adding a tier, an eviction): hashes the map does not
// resolve are skipped and counted in Result.Unknown. Such an OpAdd adds a
// tier to blocks the pod holds, never a block. An OpRemove with Keys
// names its blocks by Keys.
//
// The map resolves a hash only while the pod holds its key on some tier:
// a pair whose key the pod no longer holds (removed, cleared, forgotten,
// or forgotten by a bounded store for room) resolves nothing. An OpRemove
// by engine hash that leaves the key on no tier drops the pair; a store
// drops the other pairs whose key went in time, so that a pod's map stays
// within a few times its blocks however its blocks go. (Until then, such
// a pair may resolve again should the pod hold its key again by an OpAdd
// without Engine; with Engine, the pair is recorded again anyway.)
type Op struct {
	Kind OpKind
	Tier Tier
	Keys []uint64
	// Engine is empty, as long as Keys, or given without Keys (above);
	// anything else is invalid.
	Engine []uint64
	// Parent, when HasParent, is the key the added keys continue (the
	// BlockStored event's parent): a hint a store may use to lay a chain's
	// blocks out together, so that a lookup walking it reads them at once.
	Parent    uint64
	HasParent bool
}

// Result is what Apply did. When Apply fails part way, it says what the
// ops before the failure did.
type Result struct {
	// Duplicate is set when the batch's Seq was at or below the pod's
	// applied seq: nothing changed.
	Duplicate bool
	// AppliedSeq is the pod's applied seq after the call (0 for a pod
	// without one).
	AppliedSeq uint64
	// Removed counts the (key, tier) holdings OpRemove removed.
	Removed int
	// Unknown counts what OpRemove named that the pod did not hold on
	// that tier, and the engine hashes (of OpAdd or OpRemove) the map did
	// not resolve.
	Unknown int
}

// ModelState is what a store keeps of a model.
type ModelState struct {
	// KeyMode is "engine" or "tokens" once decided, "" before.
	KeyMode string
	// LoRAs are the adapters served on top of the model, in no particular
	// order.
	LoRAs []string
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
	// was last cleared or forgotten: the pod may hold a longer prefix than
	// Blocks.
	Incomplete bool
	// Stale is the pod's stale mark (SetStale).
	Stale bool
}

// PodInfo describes one pod known to a store.
type PodInfo struct {
	Name string
	// Blocks is the number of distinct keys the pod holds, on any tier.
	Blocks int
	// Evicted counts the blocks of this pod a bounded store forgot to make
	// room, or could not store for lack of room, since the pod was last
	// cleared or forgotten. While it is above 0 the pod's matches are
	// Incomplete.
	Evicted int
	// AppliedSeq is the Seq of the last batch applied, when HasSeq.
	AppliedSeq uint64
	HasSeq     bool
	// Stale is the pod's stale mark.
	Stale bool
}
