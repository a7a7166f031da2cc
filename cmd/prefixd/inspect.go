package main

import (
	"context"
	"errors"
	"io"
)

func runInspect(_ context.Context, _ []string, _, _ io.Writer) error {
	return errors.New("inspect: not built yet")
}
