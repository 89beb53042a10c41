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

// RoundTrip writes a report with writeJSON (its WriteJSON method) and
// decodes the output into a new T. The tests of bench and compare use it:
// the JSON is the form other tools consume, so a field that marshals but
// does not parse back (a duration as nanoseconds here, as text there) must
// fail a test. It returns an error rather than taking a testing.TB so that
// this package, linked into rangesvc-bench, does not import testing.
func RoundTrip[T any](writeJSON func(io.Writer) error) (T, error) {
	var back T
	var buf bytes.Buffer
	if err := writeJSON(&buf); err != nil {
		return back, err
	}
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		return back, fmt.Errorf("JSON does not decode: %w\n%s", err, buf.String())
	}
	return back, nil
}
