package authz

import (
	"context"
	"fmt"
	"unicode"
	"unicode/utf8"

	"errors"
)

// identityKey is the context key of the caller identity.
type identityKey struct{}

// WithIdentity returns a copy of ctx that carries the verified identity of
// the caller on whose behalf the store is called (internal/server/store
// binds leases to it). Only the layer that verified the identity (this
// package's interceptors) should set it; tests set it to act as a caller.
func WithIdentity(ctx context.Context, identity string) context.Context {
	return context.WithValue(ctx, identityKey{}, identity)
}

// IdentityFrom returns the caller identity ctx carries, "" if none.
func IdentityFrom(ctx context.Context) string {
	id, _ := ctx.Value(identityKey{}).(string)
	return id
}

// MaxIdentityLen bounds a caller identity (bytes of UTF-8).
const MaxIdentityLen = 1024

// ValidateIdentity is the rule for a caller identity: printable UTF-8 of at
// most MaxIdentityLen bytes ("" is valid: no identity). The store applies
// it too, to the identity an owner record holds.
func ValidateIdentity(id string) error {
	switch {
	case len(id) > MaxIdentityLen:
		return fmt.Errorf("identity is %d bytes, more than %d", len(id), MaxIdentityLen)
	case !utf8.ValidString(id):
		return errors.New("identity is not valid UTF-8")
	}
	for _, r := range id {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("identity contains the non-printable character %U", r)
		}
	}
	return nil
}
