package redis

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/prefixd/prefixd/testutil/redistest"
)

// TestLuaArithmetic checks the scripts' dec2hex and seqle, which work
// around Lua's double-precision numbers, against Go on a real server.
func TestLuaArithmetic(t *testing.T) {
	p := redistest.Start(t)
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr()})
	defer c.Close()
	ctx := context.Background()

	keys := []uint64{0, 1, 2, 9, 10, 255, 256, 999_999_999, 1_000_000_000, 1_000_000_001, 1<<32 - 1, 1 << 32,
		1<<53 - 1, 1 << 53, 1<<53 + 1, 1<<63 - 1, 1 << 63, 1<<63 + 1, 1<<64 - 1, 1<<64 - 2}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		keys = append(keys, rng.Uint64(), rng.Uint64()>>uint(rng.IntN(64)))
	}
	hexes := goredis.NewScript(luaPrelude + `
local out = {}
for i = 1, #ARGV do out[i] = dec2hex(ARGV[i]) end
return out`)
	args := make([]any, len(keys))
	for i, k := range keys {
		args[i] = memberOf(k)
	}
	got, err := hexes.Run(ctx, c, nil, args...).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if want := fmt.Sprintf("%016x", k); got[i] != want {
			t.Errorf("dec2hex(%s) = %s, want %s", memberOf(k), got[i], want)
		}
		if b := bucketOf(k); b != got[i][14:] {
			t.Errorf("bucketOf(%#x) = %s, want the last two hex digits", k, b)
		}
	}

	seqs := []uint64{0, 1, 9, 10, 9_999_999_999, 10_000_000_000, 10_000_000_001, 1<<53 + 1, 1<<53 + 2, 1<<63 - 1, 1 << 63, math.MaxUint64 - 1, math.MaxUint64}
	le := goredis.NewScript(luaPrelude + `
local out = {}
for i = 1, #ARGV, 2 do out[#out + 1] = seqle(ARGV[i], ARGV[i + 1]) and 1 or 0 end
return out`)
	var pairs []any
	var want []int64
	for _, a := range seqs {
		for _, b := range seqs {
			pairs = append(pairs, seqArg(a), seqArg(b))
			if a <= b {
				want = append(want, 1)
			} else {
				want = append(want, 0)
			}
		}
	}
	res, err := le.Run(ctx, c, nil, pairs...).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if res[i] != want[i] {
			t.Errorf("seqle(%s, %s) = %d, want %d", pairs[2*i], pairs[2*i+1], res[i], want[i])
		}
	}
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url          string
		addr, user   string
		pass         string
		db           int
		tls, cluster bool
		addrs        []string
	}{
		{url: "redis://127.0.0.1:6379", addr: "127.0.0.1:6379"},
		{url: "redis://localhost", addr: "localhost:6379"},
		{url: "redis://u:p%40ss@h:7000/3", addr: "h:7000", user: "u", pass: "p@ss", db: 3},
		{url: "redis://:secret@h:7000/0", addr: "h:7000", pass: "secret"},
		{url: "rediss://h:6380/1", addr: "h:6380", db: 1, tls: true},
		{url: "redis://[::1]:6379", addr: "[::1]:6379"},
		{url: "redis-cluster://a:1,b:2,c:3", cluster: true, addrs: []string{"a:1", "b:2", "c:3"}},
		{url: "redis-cluster://u:pw@a:1,b:2/", cluster: true, user: "u", pass: "pw", addrs: []string{"a:1", "b:2"}},
		{url: "redis-cluster://a:1", cluster: true, addrs: []string{"a:1"}},
	} {
		co, err := parseURL(tc.url, time.Second)
		if err != nil {
			t.Errorf("parseURL(%q): %v", tc.url, err)
			continue
		}
		if tc.cluster {
			o := co.cluster
			if o == nil || strings.Join(o.Addrs, ",") != strings.Join(tc.addrs, ",") || o.Username != tc.user || o.Password != tc.pass {
				t.Errorf("parseURL(%q) = %+v, want cluster %v user %q pass %q", tc.url, o, tc.addrs, tc.user, tc.pass)
				continue
			}
			if o.ReadTimeout != time.Second || o.WriteTimeout != time.Second || o.DialTimeout != time.Second || !o.ContextTimeoutEnabled {
				t.Errorf("parseURL(%q): timeouts %v %v %v, context %v", tc.url, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.ContextTimeoutEnabled)
			}
			continue
		}
		o := co.single
		if o == nil || o.Addr != tc.addr || o.Username != tc.user || o.Password != tc.pass || o.DB != tc.db || (o.TLSConfig != nil) != tc.tls {
			t.Errorf("parseURL(%q) = %+v, want %s user %q pass %q db %d tls %v", tc.url, o, tc.addr, tc.user, tc.pass, tc.db, tc.tls)
			continue
		}
		if tc.tls && o.TLSConfig.ServerName != "h" {
			t.Errorf("parseURL(%q): TLS server name %q", tc.url, o.TLSConfig.ServerName)
		}
		if o.ReadTimeout != time.Second || o.WriteTimeout != time.Second || o.DialTimeout != time.Second || !o.ContextTimeoutEnabled {
			t.Errorf("parseURL(%q): timeouts %v %v %v, context %v", tc.url, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.ContextTimeoutEnabled)
		}
	}

	for _, bad := range []struct{ url, want string }{
		{"", "no URL"},
		{"localhost:6379", "want redis://"},
		{"http://h:1", `scheme "http"`},
		{"redis://", "no host"},
		{"redis://h:notaport", "invalid port"},
		{"redis://h:99999", `port "99999"`},
		{"redis://u:topsecret@h:99999", `port "99999"`},
		{"redis://u:topsecret@h:1/notadb", "database"},
		{"redis://h:1/1/2", "path"},
		{"redis://h:1/?nosuchoption=1", "nosuchoption"},
		{"redis-cluster://", `seed ""`},
		{"redis-cluster://a:1,,b:2", `seed ""`},
		{"redis-cluster://a:1,b", `seed "b"`},
		{"redis-cluster://a:1,b:x", `seed "b:x"`},
		{"redis-cluster://u:topsecret@a:1/0", "no database"},
		{"redis-cluster://a:1?x=1", "no database"},
	} {
		_, err := parseURL(bad.url, time.Second)
		if !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("parseURL(%q) = %v, want ErrInvalidOptions saying %q", bad.url, err, bad.want)
		}
		if err != nil && strings.Contains(err.Error(), "topsecret") {
			t.Errorf("parseURL(%q): the error shows the password: %v", bad.url, err)
		}
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"redis://h:1":                       "redis://h:1",
		"redis://u:pw@h:1/2":                "redis://u:xxxxx@h:1/2",
		"redis://:pw@h:1":                   "redis://:xxxxx@h:1",
		"redis://u@h:1":                     "redis://u@h:1",
		"redis-cluster://u:p@w@a:1,b:2":     "redis-cluster://u:xxxxx@a:1,b:2",
		"rediss://u:pw@h:1/?x=a@b":          "rediss://u:xxxxx@h:1/?x=a@b",
		"redis://u:p:w@h:notaport":          "redis://u:xxxxx@h:notaport",
		"not a url u:pw@h":                  "not a url u:pw@h",
		"redis-cluster://a:1,b:2/?pw=x@y:z": "redis-cluster://a:1,b:2/?pw=x@y:z",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
