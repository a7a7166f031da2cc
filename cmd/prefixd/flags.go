package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

// errUsage is returned after a usage error has been reported to stderr.
var errUsage = errors.New("usage error")

// newFlagSet returns a FlagSet for one subcommand that writes its usage to stderr.
func newFlagSet(name, args string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("prefixd "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: prefixd %s [flags] %s\n\nFlags (each also PREFIXD_<FLAG> in the environment):\n", name, args)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags sets flags from PREFIXD_* environment variables, then from
// args, so that the command line wins. Errors are reported on stderr and
// returned as errUsage; --help returns flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string) error {
	_, err := parseFlagsConfig(fs, args)
	return err
}

// parseFlagsConfig is parseFlags for commands with a --config flag: the
// file's values come first, then the environment's, then the command
// line's. It returns the file read, or nil.
func parseFlagsConfig(fs *flag.FlagSet, args []string) (*fileConfig, error) {
	var cfg *fileConfig
	if fs.Lookup("config") != nil {
		path, err := configPath(args)
		if err != nil {
			fmt.Fprintln(fs.Output(), "prefixd:", err)
			return nil, errUsage
		}
		if path != "" {
			if cfg, err = loadConfig(path); err == nil {
				err = cfg.apply(fs)
			}
			if err != nil {
				fmt.Fprintln(fs.Output(), "prefixd: config:", err)
				return nil, errUsage
			}
		}
	}
	return cfg, parseEnvArgs(fs, args)
}

func parseEnvArgs(fs *flag.FlagSet, args []string) error {
	var envErr error
	newSource(fs)
	fs.VisitAll(func(f *flag.Flag) {
		key := "PREFIXD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		v, ok := os.LookupEnv(key)
		if !ok || envErr != nil {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			envErr = fmt.Errorf("invalid value %q for %s: %w", v, key, err)
		}
	})
	if envErr != nil {
		fmt.Fprintln(fs.Output(), envErr)
		return errUsage
	}
	newSource(fs)
	// Flags may come before, between and after positional arguments, as
	// in "prefixd replay a.jsonl b.jsonl --query q.jsonl"; "--" ends flags.
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return errUsage
		}
		rest := fs.Args()
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			positional = append(positional, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	return fs.Parse(append([]string{"--"}, positional...))
}

// usageErrorf reports a usage error on the flag set's output.
func usageErrorf(fs *flag.FlagSet, format string, a ...any) error {
	fmt.Fprintf(fs.Output(), "prefixd: "+format+"\n", a...)
	fs.Usage()
	return errUsage
}

// logFlags choose the format and level of a command's structured log.
type logFlags struct {
	format string
	level  string
}

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.format, "log-format", "text", "log format: text or json")
	fs.StringVar(&l.level, "log-level", "info", "least level logged: debug, info, warn or error")
}

// logger builds the log the flags describe, writing to w.
func (l *logFlags) logger(fs *flag.FlagSet, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.level)); err != nil {
		return nil, usageErrorf(fs, "--log-level %q: want debug, info, warn or error", l.level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch l.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageErrorf(fs, "--log-format %q: want text or json", l.format)
}

// listFlag is a repeatable string flag. Values given by a later source
// (the environment after the configuration file, the command line after
// both) replace those of an earlier one instead of adding to them.
type listFlag struct {
	vals []string
	// replace is set between sources: the next Set starts a new list.
	replace bool
}

func (l *listFlag) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(l.vals, " ")
}

func (l *listFlag) Set(v string) error {
	if l.replace {
		l.vals, l.replace = nil, false
	}
	l.vals = append(l.vals, v)
	return nil
}

// newSource makes the next Set of every list flag of fs start a new list.
func newSource(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		if l, ok := f.Value.(*listFlag); ok {
			l.replace = true
		}
	})
}
