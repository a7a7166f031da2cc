package events_test

import (
	"path/filepath"
	"testing"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/internal/fixture/derive"
)

// Package derive imports events, so its rewrites of the shared recordings
// seed FuzzDecode from here: every live message of every recording in
// every derived form (map encoding, hybrid groups, the newest fields,
// offload media, binary hashes, ...). Without ../shared the seeder skips
// FuzzDecode outside CI, as FuzzDecode's own recording seeds do.
func init() {
	events.AddFuzzSeeds(func(f *testing.F) {
		sim := fixture.SimDir(f)
		for _, name := range fixture.Recordings {
			files, err := filepath.Glob(filepath.Join(sim, name, "events*.jsonl"))
			if err != nil {
				f.Fatal(err)
			}
			for _, file := range files {
				if filepath.Ext(filepath.Base(file[:len(file)-len(".jsonl")])) == ".decoded" {
					continue
				}
				for _, form := range derive.Forms {
					for _, m := range derive.Messages(f, file, form) {
						f.Add(m.Topic, m.Seq, m.Payload)
					}
				}
			}
		}
	})
}

// TestDerivedFormsDecode decodes every derived form of every recording:
// nothing fails, and the forms that carry the newest fields show them.
func TestDerivedFormsDecode(t *testing.T) {
	sim := fixture.SimDir(t)
	for _, form := range derive.Forms {
		t.Run(form.Name, func(t *testing.T) {
			var b events.Batch
			seen := map[string]bool{}
			for _, name := range fixture.Recordings {
				files, err := filepath.Glob(filepath.Join(sim, name, "events*.jsonl"))
				if err != nil || len(files) == 0 {
					t.Fatalf("%s: recordings %v, %v", name, files, err)
				}
				for _, file := range files {
					if filepath.Ext(filepath.Base(file[:len(file)-len(".jsonl")])) == ".decoded" {
						continue
					}
					for _, m := range derive.Messages(t, file, form) {
						if err := events.DecodeFrames(m.Frames, &b); err != nil {
							t.Fatalf("%s record %d: %v", file, m.Index, err)
						}
						for _, st := range b.SkippedTypes {
							seen["skipped "+string(st.Name)] = true
						}
						for _, e := range b.Events {
							if e.SpecKind != events.SpecNone {
								seen["kind "+e.SpecKind.String()] = true
							}
							if e.SlidingWindow != 0 {
								seen["sliding window"] = true
							}
							if e.Locality != events.LocalityNone {
								seen["locality "+e.Locality.String()] = true
							}
							if len(e.SessionID) != 0 {
								seen["session id"] = true
							}
							if len(e.RemainingCopies) != 0 {
								seen["remaining copies"] = true
							}
							seen["medium "+e.Medium.String()] = true
						}
					}
				}
			}
			var want []string
			switch form.Name {
			case "hybrid":
				want = []string{"kind full_attention", "kind sliding_window", "kind mamba", "sliding window"}
			case "new-fields":
				want = []string{"locality LOCAL", "session id", "remaining copies", "skipped BlockInactive"}
			case "media":
				want = []string{"medium CPU", "medium CPU_PINNED", "medium STORAGE", "medium FS", "medium OBJ",
					"medium DISK", "medium OTHER", "locality REMOTE"}
			}
			for _, w := range want {
				if !seen[w] {
					t.Errorf("no event shows %s (seen %v)", w, seen)
				}
			}
		})
	}
}
