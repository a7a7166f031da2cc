package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/indexer"
)

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "prefixd.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The file comes first, the environment overrides it, the command line
// overrides both; per-model settings start from the flags' values.
func TestConfigPrecedenceAndModels(t *testing.T) {
	path := writeConfig(t, `
zmq-bind: ["tcp://127.0.0.1:6001", "tcp://127.0.0.1:6002"]
http-addr: ":7000"
hash-seed: "from-file"
block-size: 32
models:
  llama: {hash-scheme: vllm-sha256-cbor, key-mode: engine}
  sim-model: {hash-seed: "42", loras: [sql-lora]}
`)
	newFS := func() (*flagsUnderTest, *strings.Builder) {
		var errOut strings.Builder
		f := &flagsUnderTest{}
		f.fs = newFlagSet("serve", "", &errOut)
		f.hf.register(f.fs)
		f.zf.register(f.fs, true)
		f.http = f.fs.String("http-addr", ":9090", "")
		f.fs.String("config", "", "")
		return f, &errOut
	}
	f, errOut := newFS()
	t.Setenv("PREFIXD_HASH_SEED", "from-env")
	cfg, err := parseFlagsConfig(f.fs, []string{"--config", path, "--block-size", "64"})
	if err != nil {
		t.Fatalf("%v: %s", err, errOut)
	}
	if f.hf.seed != "from-env" || f.hf.blockSize != 64 || *f.http != ":7000" || len(f.zf.binds) != 2 {
		t.Errorf("seed %q block %d http %q binds %v", f.hf.seed, f.hf.blockSize, *f.http, f.zf.binds)
	}
	models, err := cfg.modelOptions(indexer.ModelOptions{HashScheme: "llmd", HashSeed: "base", BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	if m := models["llama"]; m.HashScheme != "vllm-sha256-cbor" || m.KeyMode != indexer.KeyModeEngine || m.HashSeed != "base" {
		t.Errorf("llama: %+v", m)
	}
	if m := models["sim-model"]; m.HashSeed != "42" || m.HashScheme != "llmd" || len(m.LoRAs) != 1 {
		t.Errorf("sim-model: %+v", m)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	for text, want := range map[string]string{
		"http-adr: x\n":                         `unknown field "http-adr"`,
		"http-addr: [a, b]\n":                   "http-addr: takes one value, not a list",
		"block-size: many\n":                    "block-size",
		"models:\n  m: {block-size: 0}\n":       "models: m:",
		"models:\n  m: {hash-sceme: llmd}\n":    "hash-sceme",
		"models:\n  m: {key-mode: sometimes}\n": "key-mode",
		"zmq-bind: [unclosed\n":                 "prefixd.yaml",
	} {
		path := writeConfig(t, text)
		code, _, errOut := runCmd(t, "serve", "--config", path, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--zmq-bind", "tcp://127.0.0.1:0")
		if code != 2 || !strings.Contains(errOut, want) {
			t.Errorf("config %q: exit %d, stderr %q; want 2 and %q", text, code, errOut, want)
		}
	}
	if code, _, errOut := runCmd(t, "serve", "--config", filepath.Join(t.TempDir(), "missing.yaml")); code != 2 || !strings.Contains(errOut, "missing.yaml") {
		t.Errorf("missing config: exit %d, %q", code, errOut)
	}
}

type flagsUnderTest struct {
	fs   *flag.FlagSet
	hf   hashFlags
	zf   zmqFlags
	http *string
}
