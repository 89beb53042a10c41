package segment

import (
	"context"
	"fmt"
)

// Caller identities bind leases to the authenticated caller that acquired
// them. The range service verifies the caller's certificate (mutual TLS),
// turns it into an identity string (see internal/server/authz: "uri:...",
// "dns:..." or "cn:...") and passes it to the Store in the call's context
// with WithIdentity. The Store then:
//
//   - records it in the owner record at Acquire (OwnerRecord.Identity,
//     record version 2), and refuses an identity already holding
//     StoreConfig.MaxCodesPerIdentity codes with ErrCodeCap;
//   - refuses Renew, Release and Allocate with ErrPermissionDenied unless the
//     caller's identity equals the one recorded for the lease.
//
// The empty identity is "no verified caller" (no mutual TLS): records are
// written as version 1, exactly as before identities existed, and no cap
// applies. The comparison is exact, so an anonymous caller cannot act on a
// lease bound to an identity, nor an identified caller on an anonymous one.

// identityKey is the context key of the caller identity.
type identityKey struct{}

// WithIdentity returns a copy of ctx that carries the verified identity of
// the caller on whose behalf the Store is called. Only the layer that
// verified the identity (the service's authentication) should set it.
func WithIdentity(ctx context.Context, identity string) context.Context {
	return context.WithValue(ctx, identityKey{}, identity)
}

// IdentityFrom returns the caller identity ctx carries, "" if none.
func IdentityFrom(ctx context.Context) string {
	id, _ := ctx.Value(identityKey{}).(string)
	return id
}

// ValidateIdentity is the rule for a caller identity: printable UTF-8 of at
// most MaxIdentityLen bytes ("" is valid: no identity). The error wraps
// ErrInvalid.
func ValidateIdentity(id string) error {
	if err := checkText("identity", id, MaxIdentityLen); err != nil {
		return fmt.Errorf("%v: %w", err, ErrInvalid)
	}
	return nil
}
