package main

import (
	"context"
	"errors"
	"io"
)

func runReplay(_ context.Context, _ []string, _, _ io.Writer) error {
	return errors.New("replay: not built yet")
}
