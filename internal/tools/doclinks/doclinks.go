// Package doclinks checks that the links of the repository's documents
// resolve: every relative Markdown link, and every link into this
// repository on GitHub (an alert's runbook_url, say), names a file that
// exists and, with a #fragment, a heading of that file. A document split or
// a heading renamed fails its test (doclinks_test.go) instead of leaving a
// link to nowhere.
//
// Anchors are GitHub's: Anchors is the one place that computes them (the
// alert runbook check in internal/tools/monitorcheck uses it too).
package doclinks

import (
	"regexp"
	"strings"
)

// Anchors returns the GitHub-style anchors of the Markdown headings in
// text: lower case, punctuation other than '-' and '_' dropped, spaces as
// '-'. Headings inside fenced code blocks are not headings. A repeated
// heading's later anchors get GitHub's "-1", "-2" suffixes.
func Anchors(text string) map[string]bool {
	out := map[string]bool{}
	inFence := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
				b.WriteRune(r)
			}
		}
		a := b.String()
		for i := 1; out[a]; i++ {
			a = b.String() + "-" + itoa(i)
		}
		out[a] = true
	}
	return out
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

// Link is one link found in a file: its target as written, on a line.
type Link struct {
	Line   int
	Target string
}

var (
	// mdLink is the target of a Markdown inline link or image: [text](target).
	mdLink = regexp.MustCompile(`\]\(([^()\s]+)\)`)
	// repoURL is a link into this repository's files on GitHub; it ends at
	// white space, a quote, a bracket or a backslash (an escape in a Go
	// string).
	repoURL = regexp.MustCompile(`https://github\.com/idrange/idrange/blob/main/([^\s"'()>\\]+)`)
)

// Links returns the links of a Markdown file's text: inline links (outside
// fenced code) and links into this repository on GitHub.
func Links(text string) []Link {
	var out []Link
	inFence := false
	for i, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			if !repoURL.MatchString(m[1]) {
				out = append(out, Link{Line: i + 1, Target: m[1]})
			}
		}
		out = append(out, RepoLinks(line, i+1)...)
	}
	return out
}

// RepoLinks returns the links into this repository on GitHub in text
// (any file: a YAML runbook_url, a Go comment), as paths from the
// repository root; line numbers count from first.
func RepoLinks(text string, first int) []Link {
	var out []Link
	for i, line := range strings.Split(text, "\n") {
		for _, m := range repoURL.FindAllStringSubmatch(line, -1) {
			out = append(out, Link{Line: first + i, Target: "/" + m[1]})
		}
	}
	return out
}
