package events

import (
	"bytes"
	"slices"
)

// Kind says which KV cache event an Event is.
type Kind uint8

const (
	// KindUnknown is an event type prefixd does not know; it is skipped and counted.
	KindUnknown Kind = iota
	// KindBlockStored lists blocks newly cached on the publishing replica.
	KindBlockStored
	// KindBlockRemoved lists engine hashes evicted from one medium.
	KindBlockRemoved
	// KindAllBlocksCleared says the replica dropped every block.
	KindAllBlocksCleared
)

var kindNames = [...]string{"Unknown", "BlockStored", "BlockRemoved", "AllBlocksCleared"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Unknown"
}

// Medium is where a block lives on its replica. A nil medium means GPU.
type Medium uint8

const (
	MediumGPU Medium = iota
	MediumCPU
	MediumCPUPinned
	MediumDisk
	// MediumOther is any medium name prefixd does not know.
	MediumOther
	// MediumStorage is vLLM's native storage offload tier (v0.27 on), which
	// replaced FS and OBJ.
	MediumStorage
	// MediumFS and MediumOBJ are vLLM 0.26's file system and object store
	// offload tiers.
	MediumFS
	MediumOBJ
)

var mediumNames = [...]string{"GPU", "CPU", "CPU_PINNED", "DISK", "OTHER", "STORAGE", "FS", "OBJ"}

func (m Medium) String() string {
	if int(m) < len(mediumNames) {
		return mediumNames[m]
	}
	return "OTHER"
}

// SpecKind is the kind of KV cache group an event's blocks belong to, from
// kv_cache_spec_kind. Hybrid models (full attention mixed with sliding
// window, chunked local attention or Mamba layers) publish one stream of
// events per group, the groups sharing block hashes.
type SpecKind uint8

const (
	// SpecNone: the event names no kind (BlockRemoved never does, and
	// publishers without hybrid groups leave it out).
	SpecNone SpecKind = iota
	SpecFullAttention
	SpecMLAAttention
	SpecSinkFullAttention
	SpecSlidingWindow
	SpecSlidingWindowMLA
	SpecMamba
	SpecChunkedLocalAttention
	SpecEncoderOnlyAttention
	SpecCrossAttention
	// SpecUnknown is the kind vLLM itself calls "unknown".
	SpecUnknown
	// SpecOther is a kind name prefixd does not know.
	SpecOther
	// NumSpecKinds is the number of SpecKind values.
	NumSpecKinds
)

var specKindNames = [NumSpecKinds]string{"", "full_attention", "mla_attention", "sink_full_attention",
	"sliding_window", "sliding_window_mla", "mamba", "chunked_local_attention",
	"encoder_only_attention", "cross_attention", "unknown", "other"}

// String returns the kind's wire name: "" for SpecNone, "other" for a
// name prefixd does not know.
func (k SpecKind) String() string {
	if k < NumSpecKinds {
		return specKindNames[k]
	}
	return "other"
}

// FullAttention reports whether blocks of this kind are whole prefixes a
// replica can reuse: full attention, MLA and sink full attention. The
// other kinds keep only part of a prefix (a window, a recurrent state).
func (k SpecKind) FullAttention() bool {
	return k == SpecFullAttention || k == SpecMLAAttention || k == SpecSinkFullAttention
}

// Locality says where a block's storage is relative to its publisher.
type Locality uint8

const (
	// LocalityNone: unspecified (the field is absent or nil).
	LocalityNone Locality = iota
	LocalityLocal
	LocalityRemote
	// LocalityOther is a value prefixd does not know.
	LocalityOther
)

var localityNames = [...]string{"", "LOCAL", "REMOTE", "OTHER"}

func (l Locality) String() string {
	if int(l) < len(localityNames) {
		return localityNames[l]
	}
	return "OTHER"
}

// Event is one decoded KV cache event. Its slices are owned by the Batch that
// holds it and are reused by the next decode into that Batch: copy what must
// outlive it.
type Event struct {
	Kind Kind

	// BlockHashes are the engine's block hashes (BlockStored, BlockRemoved).
	// Binary hashes (32 bytes for sha256, 16 for xxh3-128) are reduced to
	// their last 8 bytes, big-endian: the integer vLLM publishes.
	BlockHashes []uint64
	// ParentHash is the engine hash the first stored block continues;
	// HasParent is false when the parent is nil or the integer 0.
	ParentHash uint64
	HasParent  bool
	// TokenIDs holds BlockSize tokens per stored block; it may be empty
	// (CPU offload events).
	TokenIDs  []uint32
	BlockSize int

	Medium Medium

	LoRAID    int64
	HasLoRAID bool
	// LoRAName is empty when the event names no adapter.
	LoRAName []byte
	// ExtraKeys is the verbatim msgpack of extra_keys, or empty when nil.
	ExtraKeys []byte
	// GroupIdx is the event's KV cache group (group_idx); HasGroupIdx is
	// false when the event names none.
	GroupIdx    int64
	HasGroupIdx bool
	// SpecKind and SlidingWindow describe the event's KV cache group
	// (kv_cache_spec_kind, kv_cache_spec_sliding_window; vLLM sends them on
	// BlockStored only): SpecNone and 0 when absent or nil.
	SpecKind      SpecKind
	SlidingWindow int64
	// Locality is where the blocks' storage is relative to the publisher,
	// LocalityNone when absent or nil.
	Locality Locality
	// Ownership names the secondary offloading tier that generated the
	// event, empty for the engine's own events. Like LoRAName it holds the
	// bytes as they came, at most MaxNameBytes, not checked as UTF-8.
	Ownership []byte
	// SessionID is the session the blocks were stored for (BlockStored),
	// empty when none; bytes as for Ownership.
	SessionID []byte
	// RemainingCopies, when not empty, holds for each removed hash the
	// copies of the block that remain on the medium (BlockRemoved's
	// remaining_copy_counts): a hash with copies left is still held. Its
	// length is as it came; the decoder does not check it against
	// BlockHashes.
	RemainingCopies []uint64
}

// Batch is one published message: a topic, a sequence number and the events
// of one EventBatch. Decode into the same Batch again to reuse its memory.
type Batch struct {
	// Topic is the raw topic frame, kv@<pod>@<model> or anything else.
	Topic []byte
	Seq   uint64
	// TS is the publisher's batch timestamp in seconds since the epoch.
	TS float64
	// DPRank is the data-parallel rank, 0 when absent.
	DPRank    int
	HasDPRank bool
	Events    []Event
	// Skipped counts the events of unknown types dropped while decoding;
	// SkippedTypes names them with a count each, in the order the names
	// first came: at most MaxUnknownNames distinct names, each cut to
	// MaxUnknownNameBytes bytes, NoTypeName for map events without a type.
	// The counts add up to Skipped unless more names came than are kept.
	Skipped      int
	SkippedTypes []NameCount
	// UnknownFields counts the unknown fields skipped: map keys of the batch
	// or of an event, and array elements beyond the known positions.
	// UnknownFieldNames names them as SkippedTypes does the events: map
	// keys by themselves (batch and event keys alike), positional elements
	// by their array and index ("BlockStored[15]", "batch[3]"), keys that
	// are not strings as NonStringKeyName.
	UnknownFields     int
	UnknownFieldNames []NameCount
}

// Clone returns a deep copy of b that shares no memory with it: what
// must outlive the next decode into b (a batch held for later).
func (b *Batch) Clone() *Batch {
	c := *b
	c.Topic = bytes.Clone(b.Topic)
	c.Events = make([]Event, len(b.Events))
	for i, e := range b.Events {
		e.BlockHashes = slices.Clone(e.BlockHashes)
		e.TokenIDs = slices.Clone(e.TokenIDs)
		e.LoRAName = bytes.Clone(e.LoRAName)
		e.ExtraKeys = bytes.Clone(e.ExtraKeys)
		e.Ownership = bytes.Clone(e.Ownership)
		e.SessionID = bytes.Clone(e.SessionID)
		e.RemainingCopies = slices.Clone(e.RemainingCopies)
		c.Events[i] = e
	}
	c.SkippedTypes = cloneNames(b.SkippedTypes)
	c.UnknownFieldNames = cloneNames(b.UnknownFieldNames)
	return &c
}

func cloneNames(l []NameCount) []NameCount {
	c := slices.Clone(l)
	for i := range c {
		c[i].Name = bytes.Clone(c[i].Name)
	}
	return c
}
