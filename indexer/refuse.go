package indexer

import (
	"errors"
	"fmt"
)

// Reasons a batch is refused whole (RefusedError.Reason, and the reason
// label of prefixd_batches_refused_total).
const (
	RefuseInvalidPod   = "invalid_pod"   // the pod's name is not a valid label (events.CheckLabel)
	RefuseInvalidModel = "invalid_model" // the model's name is not a valid label
	RefuseInvalidLoRA  = "invalid_lora"  // an event's lora_name is not a valid name (events.CheckName)
	RefuseMaxPods      = "max_pods"      // Options.MaxPods pods are known
	RefuseMaxModels    = "max_models"    // Options.MaxModels models are known
)

// ErrRefused is wrapped by every RefusedError.
var ErrRefused = errors.New("batch refused")

// RefusedError is returned by Apply and AdmitPod for a batch refused as a
// whole, before any of it was applied: a name that cannot be right, or a
// limit reached. The batch's pod is unchanged (or was never created).
type RefusedError struct {
	Reason string // one of the Refuse constants
	Err    error  // what was wrong, with the offending value quoted
}

func (e *RefusedError) Error() string { return fmt.Sprintf("%v (%s): %v", ErrRefused, e.Reason, e.Err) }

// Unwrap returns ErrRefused and the cause.
func (e *RefusedError) Unwrap() []error { return []error{ErrRefused, e.Err} }

func refuse(reason string, format string, a ...any) error {
	return &RefusedError{Reason: reason, Err: fmt.Errorf(format, a...)}
}

// RefusedReason returns the reason of a RefusedError in err's chain, or "".
func RefusedReason(err error) string {
	var re *RefusedError
	if errors.As(err, &re) {
		return re.Reason
	}
	return ""
}
