// Package authz authenticates and authorises range-service callers by their
// verified TLS client certificate (mutual TLS).
//
// # Identity
//
// A caller's identity is one string taken from its verified certificate,
// in this order of preference:
//
//	uri:<first URI SAN>    uri:spiffe://example.org/ns/prod/sa/minter
//	dns:<first DNS SAN>    dns:minter-7.prod.example.org
//	cn:<subject CN>        cn:minter-7
//
// URI SANs come first because they are what workload identity systems
// (SPIFFE) issue; the CN, deprecated for names, comes last. A certificate
// naming none of them has no identity and is refused. The identity is what
// a lease is bound to (authz.WithIdentity): only the same identity may
// renew, release or allocate on it, and the per-identity code cap counts
// per identity.
//
// # Patterns
//
// --tls-allowed-identities and --tls-admin-identities take patterns of the
// same forms, "cn:", "dns:" or "uri:" followed by a name or a path.Match
// glob ("uri:spiffe://example.org/ns/prod/sa/*", "dns:*.prod.example.org",
// "cn:minter-?"). A pattern matches a certificate if it matches any of its
// names of that kind (every URI SAN, every DNS SAN, the CN), not only the
// one chosen as identity: an operator can allow a client by any name its CA
// vouched for.
//
// # Which method needs what
//
//   - RangeService methods: an identity matching an allowed pattern (empty
//     list: any verified certificate) or an admin pattern.
//   - The gRPC health and reflection services: any verified certificate.
//   - Every other method (the admin RPCs, and any service added later: the
//     rule fails closed): an identity matching an admin pattern (empty list:
//     nobody).
//
// A call without a verified certificate is Unauthenticated, a call whose
// identity is not allowed PermissionDenied.
package authz

import (
	"context"
	"crypto/x509"
	"fmt"
	"path"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Kinds of names in a certificate, as identity and pattern prefixes.
const (
	KindURI = "uri"
	KindDNS = "dns"
	KindCN  = "cn"
)

// Names are the names of a certificate in identity form ("uri:...",
// "dns:...", "cn:..."), in order of preference: URI SANs, DNS SANs, CN.
func Names(cert *x509.Certificate) []string {
	var names []string
	for _, u := range cert.URIs {
		names = append(names, KindURI+":"+u.String())
	}
	for _, d := range cert.DNSNames {
		names = append(names, KindDNS+":"+d)
	}
	if cert.Subject.CommonName != "" {
		names = append(names, KindCN+":"+cert.Subject.CommonName)
	}
	return names
}

// Identity is the identity of a certificate: its first name (Names), ""
// if it has none.
func Identity(cert *x509.Certificate) string {
	if n := Names(cert); len(n) > 0 {
		return n[0]
	}
	return ""
}

// Caller is an authenticated caller.
type Caller struct {
	// Identity is the canonical identity (see the package doc).
	Identity string
	// Names are all the certificate's names in identity form.
	Names []string
}

// FromPeer authenticates the caller of an RPC: the leaf of the certificate
// chain the TLS handshake verified. It fails (with an Unauthenticated
// status) when the connection is not TLS, the client sent no certificate,
// or its certificate names no identity.
func FromPeer(ctx context.Context) (Caller, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Caller{}, status.Error(codes.Unauthenticated, "no peer information: cannot authenticate the caller")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return Caller{}, status.Error(codes.Unauthenticated, "the connection is not TLS: a client certificate is required")
	}
	chains := info.State.VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		return Caller{}, status.Error(codes.Unauthenticated, "no verified client certificate: one signed by the server's client CA is required")
	}
	leaf := chains[0][0]
	names := Names(leaf)
	if len(names) == 0 {
		return Caller{}, status.Errorf(codes.Unauthenticated, "client certificate (serial %s) names no URI SAN, DNS SAN or CN", leaf.SerialNumber)
	}
	if err := ValidateIdentity(names[0]); err != nil {
		return Caller{}, status.Errorf(codes.Unauthenticated, "client certificate identity: %v", err)
	}
	return Caller{Identity: names[0], Names: names}, nil
}

// Pattern is one allowed-identity pattern: a kind and a path.Match glob of
// the name.
type Pattern struct {
	kind, glob string
}

// String is the pattern as written.
func (p Pattern) String() string { return p.kind + ":" + p.glob }

// ParsePatterns parses identity patterns given with flag (named in
// errors, e.g. "--tls-allowed-identities"). Each must be "cn:", "dns:" or
// "uri:" followed by a non-empty name or valid path.Match glob.
func ParsePatterns(flag string, list []string) ([]Pattern, error) {
	var out []Pattern
	for _, s := range list {
		kind, glob, ok := strings.Cut(s, ":")
		switch {
		case !ok || (kind != KindURI && kind != KindDNS && kind != KindCN):
			return nil, fmt.Errorf("%s: pattern %q: want cn:<name>, dns:<name> or uri:<name> (names may use * ? [...] globs)", flag, s)
		case glob == "":
			return nil, fmt.Errorf("%s: pattern %q has an empty name", flag, s)
		}
		if _, err := path.Match(glob, ""); err != nil {
			return nil, fmt.Errorf("%s: pattern %q: %v", flag, s, err)
		}
		out = append(out, Pattern{kind: kind, glob: glob})
	}
	return out, nil
}

// Match reports whether p matches name, a name in identity form.
func (p Pattern) Match(name string) bool {
	kind, v, ok := strings.Cut(name, ":")
	if !ok || kind != p.kind {
		return false
	}
	m, err := path.Match(p.glob, v)
	return err == nil && m
}

// matchAny reports whether any pattern matches any of names.
func matchAny(ps []Pattern, names []string) bool {
	for _, p := range ps {
		for _, n := range names {
			if p.Match(n) {
				return true
			}
		}
	}
	return false
}

// Policy decides which authenticated callers may call which methods (see
// the package doc).
type Policy struct {
	// Allowed may call the RangeService; empty: any verified certificate.
	Allowed []Pattern
	// Admin may call every method; empty: nobody may call admin methods.
	Admin []Pattern
}

// Method classes.
const (
	rangeServicePrefix = "/idrange.v1.RangeService/"
)

var openPrefixes = []string{"/grpc.health.v1.Health/", "/grpc.reflection."}

// Authorize authenticates the caller of fullMethod and checks the policy.
// On success it returns ctx carrying the caller's identity for the store
// (authz.WithIdentity). Errors are gRPC statuses: Unauthenticated or
// PermissionDenied.
func (p Policy) Authorize(ctx context.Context, fullMethod string) (context.Context, error) {
	c, err := FromPeer(ctx)
	if err != nil {
		return nil, err
	}
	admin := matchAny(p.Admin, c.Names)
	switch {
	case admin:
	case strings.HasPrefix(fullMethod, rangeServicePrefix):
		if len(p.Allowed) > 0 && !matchAny(p.Allowed, c.Names) {
			return nil, status.Errorf(codes.PermissionDenied, "caller %q matches no allowed identity (--tls-allowed-identities)", c.Identity)
		}
	case hasAnyPrefix(fullMethod, openPrefixes):
	default:
		return nil, status.Errorf(codes.PermissionDenied, "%s is for admin identities (--tls-admin-identities); caller %q is not one", fullMethod, c.Identity)
	}
	return WithIdentity(ctx, c.Identity), nil
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// UnaryInterceptor enforces the policy on unary RPCs.
func (p Policy) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := p.Authorize(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor enforces the policy on streaming RPCs.
func (p Policy) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := p.Authorize(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &stream{ServerStream: ss, ctx: ctx})
	}
}

// stream is a ServerStream whose context carries the caller identity.
type stream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *stream) Context() context.Context { return s.ctx }
