package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/blockhash"
)

// fileConfig is a YAML configuration file: every key but models is a flag
// name with its value (a list for repeatable flags), and models holds
// per-model hash settings for fleets serving several models.
//
//	zmq-bind: ["tcp://*:5557"]
//	http-addr: ":9090"
//	hash-scheme: llmd
//	models:
//	  llama-3-8b: {hash-scheme: vllm-sha256-cbor, hash-seed: "0", block-size: 16, key-mode: engine}
//	  sim-model:  {hash-seed: "42", loras: [sql-lora], cache-blocks: 8192}
type fileConfig struct {
	path   string
	flags  map[string]yaml.Node
	models map[string]modelConfig
}

// modelConfig is one model's entry; unset fields take the flags' values.
type modelConfig struct {
	HashScheme *string  `yaml:"hash-scheme"`
	HashSeed   *string  `yaml:"hash-seed"`
	BlockSize  *int     `yaml:"block-size"`
	KeyMode    *string  `yaml:"key-mode"`
	LoRAs      []string `yaml:"loras"`
	// CacheBlocks is each replica's KV cache size in blocks.
	CacheBlocks *int `yaml:"cache-blocks"`
}

// loadConfig reads a configuration file; errors name the file and field.
func loadConfig(path string) (*fileConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var top map[string]yaml.Node
	if err := yaml.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	cfg := &fileConfig{path: path, flags: top, models: map[string]modelConfig{}}
	if node, ok := top["models"]; ok {
		delete(top, "models")
		var raw bytes.Buffer
		enc := yaml.NewEncoder(&raw)
		if err := enc.Encode(&node); err != nil {
			return nil, fmt.Errorf("%s: models: %w", path, err)
		}
		dec := yaml.NewDecoder(&raw)
		dec.KnownFields(true)
		if err := dec.Decode(&cfg.models); err != nil {
			return nil, fmt.Errorf("%s: models: %w", path, err)
		}
	}
	return cfg, nil
}

// apply sets the flags the file names on fs. A key that is no flag of the
// command, or a list for a flag that takes one value, is an error.
func (c *fileConfig) apply(fs *flag.FlagSet) error {
	path := c.path
	keys := make([]string, 0, len(c.flags))
	for k := range c.flags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == "config" {
			return fmt.Errorf("%s: config: a configuration file cannot name another", path)
		}
		f := fs.Lookup(k)
		if f == nil {
			return fmt.Errorf("%s: unknown field %q: not a flag of %s", path, k, fs.Name())
		}
		node := c.flags[k]
		var values []string
		switch node.Kind {
		case yaml.ScalarNode:
			values = []string{node.Value}
		case yaml.SequenceNode:
			if _, repeatable := f.Value.(*listFlag); !repeatable {
				return fmt.Errorf("%s: %s: takes one value, not a list", path, k)
			}
			for _, item := range node.Content {
				if item.Kind != yaml.ScalarNode {
					return fmt.Errorf("%s: %s: list items must be plain values", path, k)
				}
				values = append(values, item.Value)
			}
		default:
			return fmt.Errorf("%s: %s: want a value or a list", path, k)
		}
		for _, v := range values {
			if err := fs.Set(k, v); err != nil {
				return fmt.Errorf("%s: %s: %w", path, k, err)
			}
		}
	}
	return nil
}

// modelOptions returns the per-model options of the file, each starting
// from base (the flags' model options), or, for a model of another hash
// scheme, from base with that scheme's own default seed.
func (c *fileConfig) modelOptions(base indexer.ModelOptions) (map[string]indexer.ModelOptions, error) {
	path := c.path
	out := make(map[string]indexer.ModelOptions, len(c.models))
	for name, m := range c.models {
		mo := base
		mo.LoRAs = append([]string(nil), m.LoRAs...)
		if m.HashScheme != nil && *m.HashScheme != base.HashScheme {
			// Another scheme: its own default seed, not the flags'.
			scheme, err := blockhash.ParseScheme(*m.HashScheme)
			if err != nil {
				return nil, fmt.Errorf("%s: models: %s: hash-scheme: %w", path, name, err)
			}
			mo.HashScheme, mo.HashSeed = *m.HashScheme, blockhash.DefaultSeed(scheme)
		}
		if m.HashSeed != nil {
			mo.HashSeed = *m.HashSeed
		}
		if m.BlockSize != nil {
			mo.BlockSize = *m.BlockSize
		}
		if m.CacheBlocks != nil {
			mo.CacheBlocks = *m.CacheBlocks
		}
		if m.KeyMode != nil {
			km, err := indexer.ParseKeyMode(*m.KeyMode)
			if err != nil {
				return nil, fmt.Errorf("%s: models: %s: key-mode: %w", path, name, err)
			}
			mo.KeyMode = km
		}
		if err := mo.Validate(); err != nil {
			return nil, fmt.Errorf("%s: models: %s: %w", path, name, err)
		}
		out[name] = mo
	}
	return out, nil
}

// configPath finds --config in args (either form) or PREFIXD_CONFIG, before
// the flags are parsed, so that the file can be applied first.
func configPath(args []string) (string, error) {
	path := os.Getenv("PREFIXD_CONFIG")
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "config" {
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return "", errors.New("--config needs a file")
			}
			i++
			val = args[i]
		}
		path = val
	}
	return path, nil
}
