package httplimit

import "context"

type identityKey struct{}

// WithIdentity returns a copy of ctx that carries the authenticated caller's
// identity, the {user} part of key templates. Call it in the authentication
// middleware, which must run before this one:
//
//	r = r.WithContext(httplimit.WithIdentity(r.Context(), userID))
//
// An empty id is no identity: {user} is then missing.
func WithIdentity(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// IdentityFrom returns the identity WithIdentity put in ctx.
func IdentityFrom(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(identityKey{}).(string)
	return id, ok && id != ""
}
