// Package reporttest checks, in the tests of bench and compare, that a
// report's JSON reads back into its own type: the JSON is the form other
// tools consume, so a field that marshals but does not parse back (a
// duration as nanoseconds here, as text there) must fail a test.
package reporttest

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"
)

// RoundTrip writes a report with writeJSON (its WriteJSON method) and
// decodes the output into a new T, failing t if either step fails.
func RoundTrip[T any](t testing.TB, writeJSON func(io.Writer) error) T {
	t.Helper()
	var buf bytes.Buffer
	if err := writeJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var back T
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatalf("JSON does not decode: %v\n%s", err, buf.String())
	}
	return back
}
