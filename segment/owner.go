package segment

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// MaxOwnerLen bounds the free-text owner of a lease (bytes of UTF-8).
const MaxOwnerLen = 256

// ValidateOwner is the rule for the free-text owner a client gives when it
// acquires a lease (recorded for operators): printable UTF-8 of at most
// MaxOwnerLen bytes. The error names the problem and matches ErrInvalid
// (errors.Is); its message does not repeat ErrInvalid's, so a stored
// record that breaks the rule can be reported with it as corrupt.
func ValidateOwner(s string) error {
	if len(s) > MaxOwnerLen {
		return &invalidField{fmt.Sprintf("owner is %d bytes, more than %d", len(s), MaxOwnerLen)}
	}
	if !utf8.ValidString(s) {
		return &invalidField{"owner is not valid UTF-8"}
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return &invalidField{fmt.Sprintf("owner contains the non-printable character %U", r)}
		}
	}
	return nil
}

// invalidField is a bad request field: the message names it, and errors.Is
// matches it against ErrInvalid.
type invalidField struct{ msg string }

func (e *invalidField) Error() string        { return e.msg }
func (e *invalidField) Is(target error) bool { return target == ErrInvalid }
