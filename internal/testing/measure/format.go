// Formatting: how the measuring commands (compare, bench) put figures on
// paper, so the same figure reads the same in every table: a duration in
// JSON as time.Duration's text ("1.5s"), a latency with three significant
// digits and its unit, a rate or a count with an SI suffix ("2.05M"), and a
// report as indented JSON. It formats, never measures.

package measure

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// Dur is a time.Duration that marshals as text in time.Duration's format
// ("1.5s") rather than as a count of nanoseconds, so a JSON report is
// readable and parses back exactly.
type Dur time.Duration

// MarshalText writes the duration in time.Duration's format.
func (d Dur) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText parses time.Duration's format.
func (d *Dur) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = Dur(v)
	return err
}

// Latency prints d with three significant digits in the largest unit
// below it: "850ns", "12.3µs", "1.05ms", "2.5s".
func Latency(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.3gµs", float64(d)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.3gms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.3gs", d.Seconds())
}

// SI prints a rate or a count with an SI suffix: "2.05M" from a million
// up, "4.1k" from a thousand up, a whole number below.
func SI(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

// WriteJSON writes v as JSON indented by two spaces, with a final newline.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// TB is the part of testing.TB that RoundTrip uses: this package is linked
// into rangesvc-bench, which must not link testing.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// RoundTrip writes a report with writeJSON (its WriteJSON method) and
// decodes the output into a new T, failing t if either step fails. The
// tests of bench and compare use it: the JSON is the form other tools
// consume, so a field that marshals but does not parse back (a duration as
// nanoseconds here, as text there) must fail a test.
func RoundTrip[T any](t TB, writeJSON func(io.Writer) error) T {
	t.Helper()
	var buf bytes.Buffer
	if err := writeJSON(&buf); err != nil {
		t.Fatalf("WriteJSON: %v", err)
	}
	var back T
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatalf("JSON does not decode: %v\n%s", err, buf.String())
	}
	return back
}

// Printer is a report that says whether its run passed and prints itself:
// the full reports of bench and compare, behind their public headline
// reports.
type Printer interface {
	Err() error
	WriteJSON(w io.Writer) error
	WriteMarkdown(w io.Writer) error
}

// Or returns p, or, when p is nil (a headline report decoded from JSON has
// no full report behind it), a Printer whose methods say so, naming what.
func Or(p Printer, what string) Printer {
	if p == nil {
		return noDetail{fmt.Errorf("%s: this report did not come from Run: it has no figures beyond its fields", what)}
	}
	return p
}

type noDetail struct{ err error }

func (n noDetail) Err() error                    { return n.err }
func (n noDetail) WriteJSON(io.Writer) error     { return n.err }
func (n noDetail) WriteMarkdown(io.Writer) error { return n.err }
