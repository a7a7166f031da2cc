// Command prefixd is a precise prefix index for LLM inference fleets.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// command is one prefixd subcommand. run gets the arguments after its name.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"hash", "print the block hashes of a prompt", runHash},
		{"inspect", "print what recordings of KV events hold", runInspect},
		{"replay", "build the index from recordings and answer queries", runReplay},
		{"query", "ask a running prefixd which pods hold how much of a prompt", runQuery},
		{"serve", "subscribe to publishers' KV events and serve the live index", runServe},
		{"record", "record publishers' KV event messages to a file", runRecord},
		{"version", "print the version", runVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) > 1 {
			return run(ctx, []string{args[1], "--help"}, stdout, stderr)
		}
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
			return 2
		default:
			fmt.Fprintf(stderr, "prefixd %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "prefixd: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "prefixd: a precise prefix index for LLM inference fleets.")
	fmt.Fprintln(w, "\nUsage: prefixd <command> [flags]\n\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'prefixd <command> --help' for a command's flags. Every flag can also be set")
	fmt.Fprintln(w, "from the environment as PREFIXD_<FLAG>, upper case with '-' as '_'.")
}

var version = "dev"

func runVersion(_ context.Context, _ []string, stdout, _ io.Writer) error {
	fmt.Fprintln(stdout, "prefixd", version)
	return nil
}
