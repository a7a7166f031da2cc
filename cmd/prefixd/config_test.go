package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/blockhash"
	"github.com/prefixd/prefixd/rpc"
	"github.com/prefixd/prefixd/store/memory"
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
	if f.hf.seed != "from-env" || f.hf.blockSize != 64 || *f.http != ":7000" || len(f.zf.binds.vals) != 2 {
		t.Errorf("seed %q block %d http %q binds %v", f.hf.seed, f.hf.blockSize, *f.http, f.zf.binds.vals)
	}
	models, err := cfg.modelOptions(indexer.ModelOptions{HashScheme: "llmd", HashSeed: "base", BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	// Another scheme than the flags' starts from its own default seed.
	if m := models["llama"]; m.HashScheme != "vllm-sha256-cbor" || m.KeyMode != indexer.KeyModeEngine || m.HashSeed != blockhash.VLLMDefaultSeed {
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

// A later source of a repeatable flag replaces an earlier one's values.
func TestListFlagsReplaceAcrossSources(t *testing.T) {
	path := writeConfig(t, "zmq-bind: [\"tcp://127.0.0.1:1\", \"tcp://127.0.0.1:2\"]\n")
	parse := func(args ...string) []string {
		t.Helper()
		var errOut strings.Builder
		var zf zmqFlags
		fs := newFlagSet("serve", "", &errOut)
		zf.register(fs, true)
		fs.String("config", "", "")
		if _, err := parseFlagsConfig(fs, append([]string{"--config", path}, args...)); err != nil {
			t.Fatalf("%v: %s", err, errOut.String())
		}
		return zf.binds.vals
	}
	if got := parse(); len(got) != 2 {
		t.Errorf("file alone: %q", got)
	}
	t.Setenv("PREFIXD_ZMQ_BIND", "tcp://127.0.0.1:3")
	if got := parse(); strings.Join(got, " ") != "tcp://127.0.0.1:3" {
		t.Errorf("environment over file: %q", got)
	}
	if got := parse("--zmq-bind", "tcp://127.0.0.1:4", "--zmq-bind", "tcp://127.0.0.1:5"); strings.Join(got, " ") != "tcp://127.0.0.1:4 tcp://127.0.0.1:5" {
		t.Errorf("command line over both: %q", got)
	}
}

// TestDeployManifest checks that the Kubernetes manifest's configuration
// file and arguments are ones prefixd serve accepts, and that its ports are
// the ones it configures: serve runs with them (addresses moved to
// loopback) until it is ready.
func TestDeployManifest(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "kubernetes", "prefixd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var config string
	var args []string
	ports := map[string]int{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc struct {
			Kind string `yaml:"kind"`
			Data map[string]string
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Args  []string `yaml:"args"`
							Ports []struct {
								Name          string `yaml:"name"`
								ContainerPort int    `yaml:"containerPort"`
							} `yaml:"ports"`
						} `yaml:"containers"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&doc); err != nil {
			break
		}
		switch doc.Kind {
		case "ConfigMap":
			config = doc.Data["prefixd.yaml"]
		case "Deployment":
			c := doc.Spec.Template.Spec.Containers[0]
			args = c.Args
			for _, p := range c.Ports {
				ports[p.Name] = p.ContainerPort
			}
		}
	}
	if config == "" || len(args) == 0 {
		t.Fatalf("manifest lacks the ConfigMap or the Deployment's args")
	}
	for _, want := range []string{fmt.Sprintf("tcp://*:%d", ports["zmq"]), fmt.Sprintf(":%d", ports["grpc"]), fmt.Sprintf(":%d", ports["http"])} {
		if !strings.Contains(config, want) {
			t.Errorf("configuration does not listen on %s, a port of the container", want)
		}
	}
	path := writeConfig(t, config)
	for i, a := range args {
		if a == "/etc/prefixd/prefixd.yaml" {
			args[i] = path
		}
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	s := startCmd(t, append(args, "--zmq-bind", fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t)), "--grpc-addr", "127.0.0.1:0", "--http-addr", strings.TrimPrefix(base, "http://"))...)
	waitFor(t, "ready", s, func() bool { code, _ := get(base + "/readyz"); return code == 200 })
	if code := s.stop(t); code != 0 {
		t.Fatalf("serve exit %d:\n%s", code, s.stderr.String())
	}
}

// The example configuration in testdata is one serve accepts.
func TestExampleConfig(t *testing.T) {
	var errOut strings.Builder
	fs := newFlagSet("serve", "", &errOut)
	var (
		hf hashFlags
		zf zmqFlags
		lf logFlags
	)
	hf.register(fs)
	zf.register(fs, true)
	lf.register(fs)
	limits := rpc.DefaultLimits()
	limits.AddFlags(fs)
	var so memory.Options
	so.AddFlags(fs)
	fs.String("grpc-addr", "", "")
	fs.String("http-addr", "", "")
	fs.String("config", "", "")
	cfg, err := parseFlagsConfig(fs, []string{"--config", filepath.Join("..", "..", "testdata", "prefixd.yaml")})
	if err != nil {
		t.Fatalf("%v: %s", err, errOut.String())
	}
	if err := zf.parse(fs); err != nil {
		t.Fatal(err)
	}
	mo, err := hf.modelOptions(fs)
	if err != nil {
		t.Fatal(err)
	}
	models, err := cfg.modelOptions(mo)
	if err != nil || len(models) != 2 || models["sim-model"].HashSeed != "42" || zf.parsedReplays["10.0.0.7:8000"] == "" || limits.MaxTokens != 65536 {
		t.Fatalf("models %+v, replays %v, limits %+v, err %v", models, zf.parsedReplays, limits, err)
	}
}
