package events

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

// Medium is the storage tier a block lives on. A nil medium means GPU.
type Medium uint8

const (
	MediumGPU Medium = iota
	MediumCPU
	MediumCPUPinned
	MediumDisk
	// MediumOther is any medium name prefixd does not know.
	MediumOther
)

var mediumNames = [...]string{"GPU", "CPU", "CPU_PINNED", "DISK", "OTHER"}

func (m Medium) String() string {
	if int(m) < len(mediumNames) {
		return mediumNames[m]
	}
	return "OTHER"
}

// Event is one decoded KV cache event. Its slices are owned by the Batch that
// holds it and are reused by the next decode into that Batch: copy what must
// outlive it.
type Event struct {
	Kind Kind

	// BlockHashes are the engine's block hashes (BlockStored, BlockRemoved).
	// 32-byte binary hashes are reduced to their last 8 bytes, big-endian.
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
	ExtraKeys   []byte
	GroupIdx    int64
	HasGroupIdx bool
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
	// Skipped counts unknown event types dropped while decoding.
	Skipped int
	// UnknownFields counts unknown map keys or extra trailing fields skipped.
	UnknownFields int
}
