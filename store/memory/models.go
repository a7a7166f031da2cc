package memory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/prefixd/prefixd/store"
)

const (
	// MaxModels is how many models a Store keeps state of.
	MaxModels = 1024
	// MaxLoRAs is how many LoRA adapters a Store keeps, of all models.
	MaxLoRAs = 1 << 16
)

var (
	// ErrTooManyModels is returned by DecideKeyMode and AddLoRA for a model
	// the store does not know when it knows MaxModels already.
	ErrTooManyModels = errors.New("memory: too many models")
	// ErrTooManyLoRAs is returned by AddLoRA for an adapter the store does
	// not know when it knows MaxLoRAs already.
	ErrTooManyLoRAs = errors.New("memory: too many lora adapters")
)

// models is the model state: key modes and LoRA adapters. It is small,
// changes rarely and is read off the hot path, so one mutex guards it.
type models struct {
	mu     sync.Mutex             // guards the maps; the store's last lock
	byName map[string]*modelState // models by name
	base   map[string]string      // adapter -> base model
}

type modelState struct {
	mode  string
	loras []string // in the order they were added
}

// modelLocked returns model name's state, making the model known. mu is
// held.
func (m *models) modelLocked(name string) (*modelState, error) {
	if ms := m.byName[name]; ms != nil {
		return ms, nil
	}
	if len(m.byName) >= MaxModels {
		return nil, fmt.Errorf("%w: %d models known, cannot add %q", ErrTooManyModels, MaxModels, name)
	}
	if m.byName == nil {
		m.byName = make(map[string]*modelState)
	}
	ms := &modelState{}
	m.byName[name] = ms
	return ms, nil
}

// Models returns the state of every model whose key mode was decided or
// that has adapters, LoRAs sorted by name.
func (s *Store) Models(ctx context.Context) (map[string]store.ModelState, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memory: %w", err)
	}
	m := &s.models
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]store.ModelState, len(m.byName))
	for name, ms := range m.byName {
		var loras []string
		if len(ms.loras) > 0 {
			loras = slices.Sorted(slices.Values(ms.loras))
		}
		out[name] = store.ModelState{KeyMode: ms.mode, LoRAs: loras}
	}
	return out, nil
}

// DecideKeyMode records mode as model's key mode unless one is recorded,
// and returns the recorded one.
func (s *Store) DecideKeyMode(ctx context.Context, model, mode string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("memory: %w", err)
	}
	if model == "" {
		return "", fmt.Errorf("%w: empty model name", store.ErrInvalidName)
	}
	if mode != store.KeyModeEngine && mode != store.KeyModeTokens {
		return "", fmt.Errorf("%w: key mode %q, want %q or %q", store.ErrInvalidName, mode, store.KeyModeEngine, store.KeyModeTokens)
	}
	m := &s.models
	m.mu.Lock()
	defer m.mu.Unlock()
	ms, err := m.modelLocked(model)
	if err != nil {
		return "", err
	}
	if ms.mode == "" {
		ms.mode = mode
	}
	return ms.mode, nil
}

// AddLoRA records that adapter is served on top of base unless the
// adapter is recorded, and returns the recorded base.
func (s *Store) AddLoRA(ctx context.Context, adapter, base string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("memory: %w", err)
	}
	if adapter == "" || base == "" {
		return "", fmt.Errorf("%w: adapter %q of model %q: empty name", store.ErrInvalidName, adapter, base)
	}
	m := &s.models
	m.mu.Lock()
	defer m.mu.Unlock()
	if b, ok := m.base[adapter]; ok {
		return b, nil
	}
	if len(m.base) >= MaxLoRAs {
		return "", fmt.Errorf("%w: %d adapters known, cannot add %q", ErrTooManyLoRAs, MaxLoRAs, adapter)
	}
	ms, err := m.modelLocked(base)
	if err != nil {
		return "", err
	}
	if m.base == nil {
		m.base = make(map[string]string)
	}
	m.base[adapter] = base
	ms.loras = append(ms.loras, adapter)
	return base, nil
}
