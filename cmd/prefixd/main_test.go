package main

import (
	"strings"
	"testing"
)

func TestHelpAndUnknownCommands(t *testing.T) {
	code, out, _ := runCmd(t, "help")
	if code != 0 || !strings.Contains(out, "Commands:") || !strings.Contains(out, "replay") {
		t.Errorf("help: exit %d, %q", code, out)
	}
	if code, _, _ := runCmd(t); code != 2 {
		t.Errorf("no command: exit %d, want 2", code)
	}
	code, _, errOut := runCmd(t, "frobnicate")
	if code != 2 || !strings.Contains(errOut, `unknown command "frobnicate"`) {
		t.Errorf("unknown command: exit %d, %q", code, errOut)
	}
	code, _, errOut = runCmd(t, "help", "hash")
	if code != 0 || !strings.Contains(errOut, "-hash-seed") || !strings.Contains(errOut, "PREFIXD_") {
		t.Errorf("help hash: exit %d, %q", code, errOut)
	}
}

// Flags come from PREFIXD_* variables, the command line wins, and flags may
// follow positional arguments.
func TestFlagsFromEnvironment(t *testing.T) {
	hash := func(args ...string) string {
		t.Helper()
		code, out, errOut := runCmd(t, append([]string{"hash", "--model", "m", "--tokens", "1,2,3,4,5,6,7,8", "--block-size", "4"}, args...)...)
		if code != 0 {
			t.Fatalf("hash %v: exit %d: %s", args, code, errOut)
		}
		return out
	}
	plain, seeded := hash(), hash("--hash-seed", "42")
	if plain == seeded {
		t.Fatal("the seed changes nothing: the test cannot tell flags apart")
	}
	t.Setenv("PREFIXD_HASH_SEED", "42")
	if got := hash(); got != seeded {
		t.Errorf("PREFIXD_HASH_SEED=42 gave %q, want %q", got, seeded)
	}
	if got := hash("--hash-seed", ""); got != plain {
		t.Errorf("--hash-seed \"\" over the environment gave %q, want %q", got, plain)
	}
	t.Setenv("PREFIXD_BLOCK_SIZE", "four")
	if code, _, errOut := runCmd(t, "hash", "--model", "m", "--tokens", "1"); code != 2 || !strings.Contains(errOut, "PREFIXD_BLOCK_SIZE") {
		t.Errorf("bad environment value: exit %d, %q", code, errOut)
	}
}

func TestParseFlagsInterspersed(t *testing.T) {
	fs := newFlagSet("x", "", &strings.Builder{})
	q := fs.String("query", "", "")
	if err := parseFlags(fs, []string{"a", "--query", "q", "b", "--", "--not-a-flag"}); err != nil {
		t.Fatal(err)
	}
	if *q != "q" || strings.Join(fs.Args(), " ") != "a b --not-a-flag" {
		t.Errorf("query %q, args %q", *q, fs.Args())
	}
}
