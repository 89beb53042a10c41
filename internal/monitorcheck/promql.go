package monitorcheck

import (
	"sort"
	"strings"
)

// aggregations are PromQL's aggregation operators: like functions, but
// they may be followed by a by/without clause instead of "(".
var aggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true,
	"stdvar": true, "count": true, "count_values": true, "bottomk": true, "topk": true,
	"quantile": true, "limitk": true, "limit_ratio": true,
}

// keywords are PromQL words that are not metric names. The grouping ones
// take a parenthesised label list, skipped with them.
var keywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true, "inf": true, "nan": true, "atan2": true,
}

// labelLists are the keywords whose following "( ... )" lists label names.
var labelLists = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true,
}

// metricNames returns the metric names a PromQL expression selects, sorted
// and without duplicates: every identifier that is not a function, an
// aggregation or a keyword, outside strings, label matchers ({...}), range
// and subquery brackets ([...]), durations and grouping label lists.
// Grafana variables ($name, ${name}) are skipped. It is a scanner, not a
// parser: promtool checks the syntax; this only needs the names.
func metricNames(expr string) []string {
	seen := map[string]bool{}
	s := expr
	i := 0
	skipSpace := func(j int) int {
		for j < len(s) && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n' || s[j] == '\r') {
			j++
		}
		return j
	}
	// skipTo returns the index just past the bracket closing the one at
	// s[j], skipping strings inside it.
	skipTo := func(j int, open, close byte) int {
		depth := 0
		for j < len(s) {
			switch c := s[j]; {
			case c == '"' || c == '\'' || c == '`':
				j = skipString(s, j)
				continue
			case c == open:
				depth++
			case c == close:
				depth--
				if depth == 0 {
					return j + 1
				}
			}
			j++
		}
		return j
	}
	for i < len(s) {
		c := s[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i = skipString(s, i)
		case c == '#': // comment to the end of the line
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '{':
			i = skipTo(i, '{', '}')
		case c == '[':
			i = skipTo(i, '[', ']')
		case c == '$': // Grafana variable: $name or ${name}
			i++
			if i < len(s) && s[i] == '{' {
				i = skipTo(i, '{', '}')
				continue
			}
			for i < len(s) && isIdent(s[i], false) {
				i++
			}
		case c >= '0' && c <= '9' || c == '.' && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9':
			// A number or a duration (5m, 1h30m, 1e9, 0x1f): digits, dots,
			// letters and an exponent's sign.
			for i < len(s) && (isIdent(s[i], false) || s[i] == '.' ||
				(s[i] == '+' || s[i] == '-') && (s[i-1] == 'e' || s[i-1] == 'E')) {
				i++
			}
		case isIdent(c, true):
			j := i
			for j < len(s) && isIdent(s[j], false) {
				j++
			}
			word := s[i:j]
			k := skipSpace(j)
			next := byte(0)
			if k < len(s) {
				next = s[k]
			}
			lower := strings.ToLower(word)
			switch {
			case labelLists[lower]:
				if next == '(' {
					j = skipTo(k, '(', ')')
				}
			case keywords[lower], aggregations[lower], next == '(':
				// A function, an aggregation or a keyword.
			default:
				seen[word] = true
			}
			i = j
		default:
			i++
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// skipString returns the index just past the string literal starting at
// s[i] (its quote), honouring backslash escapes except in raw `strings`.
func skipString(s string, i int) int {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case s[j] == '\\' && q != '`':
			j++
		case s[j] == q:
			return j + 1
		}
	}
	return len(s)
}

// isIdent reports whether c may appear in a metric name (first: may start
// one). Colons are allowed: recording rule names use them.
func isIdent(c byte, first bool) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || !first && c >= '0' && c <= '9'
}
