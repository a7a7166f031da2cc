package redis

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of the Options fields left zero.
const (
	DefaultPrefix   = "prefixd:"
	DefaultLeaseTTL = 10 * time.Second
	DefaultTimeout  = 2 * time.Second
)

// ErrInvalidOptions is returned by New for unusable options, a URL it
// cannot parse above all.
var ErrInvalidOptions = errors.New("redis: invalid options")

// Options configures a Store. Zero fields take their defaults.
type Options struct {
	// URL: redis://[user:pass@]HOST:PORT[/DB], rediss://... (TLS), or
	// redis-cluster://HOST:PORT,HOST:PORT,... (seed nodes; the client discovers the rest, follows MOVED/ASK).
	URL string
	// Prefix starts every key the store writes, default "prefixd:", so
	// that several fleets share one Redis. It may not contain '{' or '}':
	// the store's hash tags are built on it.
	Prefix string
	// BlockTTL: 0: blocks never expire; else a block not stored again
	// within it expires (by any pod: the expiry is the block key's).
	BlockTTL time.Duration
	// Owner is this process's lease owner id; default random.
	Owner string
	// LeaseTTL is how long a pod's write lease outlives its holder's last
	// batch; default 10s.
	LeaseTTL time.Duration
	// Timeout bounds each call whose ctx has no earlier deadline; default 2s.
	// It is also the client's dial, read and write timeout.
	Timeout time.Duration
	// Logger receives the store's few logs; nil logs nothing.
	Logger *slog.Logger
	// Registerer receives the store's metrics (calls, errors and latency
	// by operation); nil registers none.
	Registerer prometheus.Registerer
}

func (o Options) withDefaults() Options {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Owner == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		o.Owner = hex.EncodeToString(b[:])
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// validate checks o after defaults, all but the URL.
func (o Options) validate() error {
	if strings.ContainsAny(o.Prefix, "{}") {
		return fmt.Errorf("%w: prefix %q contains a brace", ErrInvalidOptions, o.Prefix)
	}
	if o.BlockTTL < 0 || o.BlockTTL > 0 && o.BlockTTL < time.Millisecond {
		return fmt.Errorf("%w: block TTL %v, want 0 or at least 1ms", ErrInvalidOptions, o.BlockTTL)
	}
	if o.LeaseTTL < time.Millisecond {
		return fmt.Errorf("%w: lease TTL %v, want at least 1ms", ErrInvalidOptions, o.LeaseTTL)
	}
	if o.Timeout < 0 {
		return fmt.Errorf("%w: timeout %v, want above 0", ErrInvalidOptions, o.Timeout)
	}
	return nil
}

// Redact returns raw with the password of its user info, if any, replaced
// by "xxxxx", for logs and errors. It works on URLs that do not parse.
func Redact(raw string) string {
	scheme := strings.Index(raw, "://")
	if scheme < 0 {
		return raw
	}
	rest := raw[scheme+3:]
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		return raw
	}
	user := rest[:at]
	if c := strings.Index(user, ":"); c >= 0 {
		user = user[:c] + ":xxxxx"
	}
	return raw[:scheme+3] + user + rest[at:]
}

// clientOptions is what New builds a client from: one of single and
// cluster is set.
type clientOptions struct {
	single  *goredis.Options
	cluster *goredis.ClusterOptions
}

// parseURL parses o.URL into client options with the store's timeouts.
func parseURL(raw string, timeout time.Duration) (clientOptions, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: URL %s: %s", ErrInvalidOptions, Redact(raw), fmt.Sprintf(format, args...))
	}
	if raw == "" {
		return clientOptions{}, fmt.Errorf("%w: no URL", ErrInvalidOptions)
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return clientOptions{}, bad("want redis://, rediss:// or redis-cluster://")
	}
	noMaint := &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	switch scheme {
	case "redis", "rediss":
		u, err := url.Parse(raw)
		if err != nil {
			return clientOptions{}, bad("%s", unwrapURLError(err))
		}
		if u.Hostname() == "" {
			return clientOptions{}, bad("no host")
		}
		if p := u.Port(); p != "" {
			if _, err := strconv.ParseUint(p, 10, 16); err != nil {
				return clientOptions{}, bad("port %q", p)
			}
		}
		opt, err := goredis.ParseURL(raw)
		if err != nil {
			msg := err.Error()
			if pw, ok := u.User.Password(); ok && pw != "" {
				msg = strings.ReplaceAll(msg, pw, "xxxxx")
			}
			return clientOptions{}, bad("%s", msg)
		}
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = timeout, timeout, timeout
		opt.PoolTimeout = timeout
		opt.ContextTimeoutEnabled = true
		opt.MaxRetries = -1 // the store's callers retry batches; see doc.go
		opt.DialerRetries = 1
		opt.MaintNotificationsConfig = noMaint
		return clientOptions{single: opt}, nil
	case "redis-cluster":
		hosts := rest
		if end := strings.IndexAny(hosts, "/?#"); end >= 0 {
			if tail := hosts[end:]; tail != "/" {
				return clientOptions{}, bad("a cluster URL has no database, path or query (%q)", tail)
			}
			hosts = hosts[:end]
		}
		opt := &goredis.ClusterOptions{
			DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout, PoolTimeout: timeout,
			ContextTimeoutEnabled:    true,
			MaxRetries:               -1,
			DialerRetries:            1,
			MaintNotificationsConfig: noMaint,
		}
		if at := strings.LastIndex(hosts, "@"); at >= 0 {
			info := hosts[:at]
			hosts = hosts[at+1:]
			user, pass, _ := strings.Cut(info, ":")
			var err error
			if opt.Username, err = url.PathUnescape(user); err != nil {
				return clientOptions{}, bad("user name: %v", err)
			}
			if opt.Password, err = url.PathUnescape(pass); err != nil {
				return clientOptions{}, bad("password does not unescape")
			}
		}
		for _, h := range strings.Split(hosts, ",") {
			host, port, err := net.SplitHostPort(h)
			if err != nil || host == "" {
				return clientOptions{}, bad("seed %q, want HOST:PORT", h)
			}
			if _, err := strconv.ParseUint(port, 10, 16); err != nil {
				return clientOptions{}, bad("seed %q: port %q", h, port)
			}
			opt.Addrs = append(opt.Addrs, h)
		}
		return clientOptions{cluster: opt}, nil
	default:
		return clientOptions{}, bad("scheme %q, want redis, rediss or redis-cluster", scheme)
	}
}

// unwrapURLError returns the reason of a url.Parse error without the URL,
// which may hold a password.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
