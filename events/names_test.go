package events

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCheckLabel(t *testing.T) {
	for _, ok := range []string{
		"127.0.0.1:8001", "[::1]:8000", "10.0.0.7:8000#1", "sim-model",
		"meta-llama/Llama-3.1-8B-Instruct", "a@b", strings.Repeat("m", MaxNameBytes),
	} {
		if err := CheckLabel([]byte(ok)); err != nil {
			t.Errorf("CheckLabel(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{
		"", "\xff\xfe:1", "sim\x00model", "a b", "a\"b", "a\\b", "a\nb", "ü", "a{b}",
		strings.Repeat("m", MaxNameBytes+1),
	} {
		if err := CheckLabel([]byte(bad)); !errors.Is(err, ErrName) {
			t.Errorf("CheckLabel(%q) = %v; want ErrName", bad, err)
		}
	}
}

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"sql-lora", "my adapter", "日本語", "a\"b", strings.Repeat("l", MaxNameBytes)} {
		if err := CheckName([]byte(ok)); err != nil {
			t.Errorf("CheckName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "\xff", "a\xc3", "tab\there", "del\x7f", "\u0085next", strings.Repeat("l", MaxNameBytes+1)} {
		if err := CheckName([]byte(bad)); !errors.Is(err, ErrName) {
			t.Errorf("CheckName(%q) = %v; want ErrName", bad, err)
		}
	}
}

// FuzzNames checks that the name checks never panic, that what CheckLabel
// accepts CheckName accepts too, and that an accepted name is valid UTF-8
// (so a metric label built from it cannot panic) within the length limit;
// and that ParseTopic's parts are sub-slices of the topic.
func FuzzNames(f *testing.F) {
	for _, s := range []string{
		"kv@127.0.0.1:8001@sim-model", "kv@\xff\xfe:1@sim-model", "kv@127.0.0.1:1@\xff",
		"kv@@m", "kv@p@", "", "kv@[::1]:8000@org/model@v2", strings.Repeat("x", 600),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		accepted := func(name []byte) {
			if !utf8.Valid(name) || len(name) == 0 || len(name) > MaxNameBytes {
				t.Fatalf("accepted %q", name)
			}
		}
		if CheckLabel(b) == nil {
			accepted(b)
			if err := CheckName(b); err != nil {
				t.Fatalf("CheckLabel accepts %q, CheckName refuses it: %v", b, err)
			}
		}
		if CheckName(b) == nil {
			accepted(b)
		}
		pod, model, ok := ParseTopic(b)
		if !ok {
			return
		}
		if len(pod) == 0 || 3+len(pod)+1+len(model) != len(b) || string(b[3:3+len(pod)]) != string(pod) {
			t.Fatalf("ParseTopic(%q) = %q, %q", b, pod, model)
		}
		for _, name := range [][]byte{pod, model} {
			if CheckLabel(name) == nil {
				accepted(name)
			}
		}
	})
}
