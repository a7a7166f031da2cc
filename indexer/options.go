package indexer

import (
	"fmt"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/store"
)

// KeyMode says how a model's index keys relate to the engine's block hashes.
type KeyMode uint8

const (
	// KeyModeAuto checks whether the configured hash scheme reproduces the
	// engine's hashes and picks engine or tokens from what it sees.
	KeyModeAuto KeyMode = iota
	// KeyModeEngine uses the engine's block hashes as index keys.
	KeyModeEngine
	// KeyModeTokens keys the index by prefixd's own chain over token ids and
	// keeps engine hash -> key per pod for removals.
	KeyModeTokens
)

func (m KeyMode) String() string {
	switch m {
	case KeyModeEngine:
		return "engine"
	case KeyModeTokens:
		return "tokens"
	default:
		return "auto"
	}
}

// ParseKeyMode parses "auto", "engine" or "tokens".
func ParseKeyMode(s string) (KeyMode, error) {
	switch s {
	case "auto", "":
		return KeyModeAuto, nil
	case "engine":
		return KeyModeEngine, nil
	case "tokens":
		return KeyModeTokens, nil
	}
	return 0, fmt.Errorf("unknown key mode %q: want auto, engine or tokens", s)
}

// ModelOptions configure how one served model is hashed and keyed.
type ModelOptions struct {
	// HashScheme is the engine's scheme (blockhash.SchemeNames): llmd,
	// vllm-sha256-cbor, vllm-xxhash-cbor or xxh3.
	HashScheme string
	// HashSeed is the engine's hash seed (PYTHONHASHSEED or --hash-seed).
	HashSeed string
	// BlockSize is the engine's tokens per block.
	BlockSize int
	KeyMode   KeyMode
	// LoRAs names adapters served on top of this model, known before any
	// event names them.
	LoRAs []string
	// CacheBlocks is the KV cache size of each replica serving the model,
	// in blocks (vLLM's num_gpu_blocks), or 0 when unknown. A store that
	// is full takes room first from pods holding more than that.
	CacheBlocks int
}

// DefaultModelOptions are the options of a model nobody configured: the
// llm-d chain with an empty seed and 16-token blocks, key mode auto.
func DefaultModelOptions() ModelOptions {
	return ModelOptions{HashScheme: "llmd", BlockSize: 16, KeyMode: KeyModeAuto}
}

// Validate reports the first invalid field.
func (o ModelOptions) Validate() error {
	if o.KeyMode > KeyModeTokens {
		return fmt.Errorf("key mode %d: unknown", o.KeyMode)
	}
	if o.CacheBlocks < 0 {
		return fmt.Errorf("cache blocks %d: want >= 0", o.CacheBlocks)
	}
	if _, _, err := newHashers(o); err != nil {
		return err
	}
	return nil
}

// Options configure an Indexer.
type Options struct {
	// Models holds per-model options by served model name; other models get
	// Default.
	Models  map[string]ModelOptions
	Default ModelOptions
	// DefaultModel names the model of sources whose topic names none.
	DefaultModel string
	// TierWeights weigh matched blocks by the fastest tier holding them.
	TierWeights [store.NumTiers]float64
	// AutoDecideAfter is how many BlockStored events that fail to re-chain
	// make key mode auto settle on tokens.
	AutoDecideAfter int
	// AutoPendingBatches bounds the batches held per model while key mode
	// auto is undecided; when full, the model settles on tokens.
	AutoPendingBatches int
	// MaxPods bounds the pods known at once: a batch of one more is refused
	// (RefuseMaxPods) until one leaves.
	MaxPods int
	// MaxModels bounds the models known at once, configured ones included:
	// a batch naming one more is refused (RefuseMaxModels).
	MaxModels int
	// MaxLoRAs bounds the LoRA adapters learned from events; adapters
	// named after that are not learned (counted), their blocks still are.
	MaxLoRAs int
}

// DefaultOptions returns the defaults: tier weights GPU 1.0, CPU 0.8, disk 0.6.
func DefaultOptions() Options {
	return Options{
		Default:            DefaultModelOptions(),
		DefaultModel:       "default",
		TierWeights:        [store.NumTiers]float64{1.0, 0.8, 0.6},
		AutoDecideAfter:    4,
		AutoPendingBatches: 256,
		MaxPods:            DefaultMaxPods,
		MaxModels:          256,
		MaxLoRAs:           4096,
	}
}

// DefaultMaxPods is the default of Options.MaxPods.
const DefaultMaxPods = 10_000

// Validate reports the first invalid field, by name.
func (o Options) Validate() error {
	if err := o.Default.Validate(); err != nil {
		return fmt.Errorf("default model: %w", err)
	}
	for name, m := range o.Models {
		if err := events.CheckLabel([]byte(name)); err != nil {
			return fmt.Errorf("models: model name %q: %w", name, err)
		}
		for _, l := range m.LoRAs {
			if err := events.CheckName([]byte(l)); err != nil {
				return fmt.Errorf("model %q: lora %q: %w", name, l, err)
			}
		}

		if err := m.Validate(); err != nil {
			return fmt.Errorf("model %q: %w", name, err)
		}
	}
	for t, w := range o.TierWeights {
		if w < 0 || w > 1 {
			return fmt.Errorf("tier weight %s = %v: want 0..1", store.Tier(t), w)
		}
	}
	if o.AutoDecideAfter <= 0 {
		return fmt.Errorf("auto decide after %d: want > 0", o.AutoDecideAfter)
	}
	if o.AutoPendingBatches <= 0 {
		return fmt.Errorf("auto pending batches %d: want > 0", o.AutoPendingBatches)
	}
	if o.MaxPods <= 0 {
		return fmt.Errorf("max pods %d: want > 0", o.MaxPods)
	}
	if o.MaxModels < len(o.Models)+1 {
		return fmt.Errorf("max models %d: want more than the %d configured models", o.MaxModels, len(o.Models))
	}
	if o.MaxLoRAs < 0 {
		return fmt.Errorf("max loras %d: want >= 0", o.MaxLoRAs)
	}
	return nil
}

func (o Options) model(name string) ModelOptions {
	if m, ok := o.Models[name]; ok {
		return m
	}
	return o.Default
}
