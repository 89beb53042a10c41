package store

import (
	"fmt"

	"github.com/idrange/idrange/segment"
)

// Unavailable marks a storage error as segment.ErrUnavailable, keeping the
// cause: "<what>: segment: store unavailable: <cause>", and errors.Is (the
// standard library's and cockroachdb/errors') sees both.
func Unavailable(cause error, format string, args ...any) error {
	return WithKind(segment.ErrUnavailable, cause, format, args...)
}

// WithKind is cause as an error of kind (a sentinel), with context:
// "<msg>: <kind>: <cause>" (without "<msg>: " when format is empty).
// errors.Is sees kind and every error in cause's chain, with the standard
// library (which in-process clients use) and cockroachdb/errors alike.
// cockroachdb/errors.Newf wraps only one %w, and its Mark is invisible to
// the standard library's errors.Is, hence this type.
func WithKind(kind, cause error, format string, args ...any) error {
	msg := ""
	if format != "" {
		msg = fmt.Sprintf(format, args...)
	}
	return &kindError{msg: msg, kind: kind, cause: cause}
}

type kindError struct {
	msg         string
	kind, cause error
}

func (e *kindError) Error() string {
	s := e.kind.Error() + ": " + e.cause.Error()
	if e.msg != "" {
		s = e.msg + ": " + s
	}
	return s
}

func (e *kindError) Unwrap() []error { return []error{e.kind, e.cause} }
