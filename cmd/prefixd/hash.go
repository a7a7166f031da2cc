package main

import (
	"context"
	"errors"
	"io"
)

func runHash(_ context.Context, _ []string, _, _ io.Writer) error {
	return errors.New("hash: not built yet")
}
