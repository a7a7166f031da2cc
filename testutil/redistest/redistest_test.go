package redistest_test

import (
	"strings"
	"testing"

	"github.com/prefixd/prefixd/testutil/redistest"
)

func TestServer(t *testing.T) {
	p := redistest.Start(t)
	if !strings.HasPrefix(p.URL(), "redis://127.0.0.1:") || p.Port >= 55535 {
		t.Fatalf("URL %s, port %d", p.URL(), p.Port)
	}
	if _, err := p.Do("SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	if v, err := p.Do("GET", "k"); err != nil || v != "v" {
		t.Fatalf("GET = %q, %v", v, err)
	}
	if v, err := redistest.Info(p.Addr(), "persistence", "aof_enabled"); err != nil || v != "0" {
		t.Fatalf("aof_enabled = %q, %v", v, err)
	}
	p.Kill()
	if _, err := p.Do("PING"); err == nil {
		t.Fatal("PING answered after Kill")
	}
	p.Restart()
	if v, err := p.Do("GET", "k"); err != nil || v != "" {
		t.Fatalf("GET after a restart = %q, %v; want nothing: no persistence", v, err)
	}
	p.Pause()
	p.Resume()
	if v, err := p.Do("PING"); err != nil || v != "PONG" {
		t.Fatalf("PING after Resume = %q, %v", v, err)
	}
}

func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	url := c.URL()
	if !strings.HasPrefix(url, "redis-cluster://") || strings.Count(url, ",") != 2 {
		t.Fatalf("URL %s", url)
	}
	// Each node serves a third of the slots: a key is on one of them.
	moved := 0
	for _, p := range c.Nodes {
		if _, err := p.Do("SET", "k", "v"); err != nil && strings.HasPrefix(err.Error(), "MOVED") {
			moved++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if moved != 2 {
		t.Fatalf("%d nodes sent SET k elsewhere, want 2", moved)
	}
}
