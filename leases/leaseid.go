package leases

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
)

// This file is the lease IDs the engine returns for shadow and elastic
// rules. The engine keeps no state of its own: what such a lease's settle
// needs beyond the store's lease (what the limits granted of the tokens
// the owner was given; for an elastic rule, what the pool lent and the
// stamp of that take) travels in its ID, "<store id>~<own>~<mac>" or
// "<store id>~<own>~<borrowed>~<stamp>~<mac>", the numbers in base 36.
//
// The client holds the ID, so the engine cannot believe what it says: a
// client that wrote a larger borrowed count into it was once given back
// that much of the pool at every settle (the pool's bound broken without
// limit), and one that sent "x~0" made any lease entry a new request that
// the server's cap on a client's keys let through as a settle. So the ID
// ends in a MAC: HMAC-SHA256 over the key, the owner's client and the rest
// of the ID, under a key that every server sharing the store shares (see
// IDKeyStore), cut to 64 bits. An ID whose MAC does not verify is not one
// of these: it goes to the store as it is, which knows no such lease
// (ErrUnknownLease), and changes nothing.

// leaseIDSep separates the parts of a lease ID of a shadow or elastic rule.
// Lease IDs of NewLeaseID never contain it.
const leaseIDSep = "~"

// idMACBytes is the length of the MAC kept in a lease ID: 64 bits, which
// an online guess cannot find.
const idMACBytes = 8

// IDKeyStore is a Store that keeps the key with which an Engine
// authenticates the lease IDs of shadow and elastic rules (see Engine). The
// stores of this package implement it: the memory store with a random key
// of its own, the Redis store with one kept in Redis, so that every server
// sharing the Redis uses the same. An Engine over a Store that does not
// implement it uses a random key of its own, so that such IDs do not
// outlive it: a settle through another Engine (another server, or after a
// reload) is refused as an unknown lease, which errs toward the limit.
type IDKeyStore interface {
	Store
	// IDKey returns the key. Every call returns the same key for as long
	// as the store's buckets last. It fails only when the store cannot be
	// reached, with an error wrapping ErrStoreUnavailable.
	IDKey(ctx context.Context) ([]byte, error)
}

// newIDKey returns a random key for lease IDs.
func newIDKey() []byte {
	k := make([]byte, 32)
	_, _ = rand.Read(k) // never fails (crypto/rand)
	return k
}

// leaseIDParts is what a lease ID of a shadow or elastic rule remembers.
type leaseIDParts struct {
	storeID  string
	own      int64 // what the own limits granted
	borrowed int64 // taken from the pool (elastic)
	stamp    int64 // the pool take's stamp (TakeOutcome.At)
	elastic  bool
}

// format returns the ID of p for client's lease of key, MAC under secret
// included.
func (p leaseIDParts) format(secret []byte, client, key string) string {
	b := make([]byte, 0, 64)
	b = append(b, p.storeID...)
	b = append(b, leaseIDSep...)
	b = strconv.AppendInt(b, p.own, 36)
	if p.elastic {
		b = append(b, leaseIDSep...)
		b = strconv.AppendInt(b, p.borrowed, 36)
		b = append(b, leaseIDSep...)
		b = strconv.AppendInt(b, p.stamp, 36)
	}
	mac := idMAC(secret, client, key, b)
	b = append(b, leaseIDSep...)
	return string(base64.RawURLEncoding.AppendEncode(b, mac))
}

// idMAC returns the MAC under secret of body, the ID of client's lease of
// key without its MAC.
func idMAC(secret []byte, client, key string, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write([]byte(client))
	h.Write([]byte{0})
	h.Write(body)
	return h.Sum(nil)[:idMACBytes]
}

// splitLeaseID splits id into its parts when it has the shape of a lease
// ID of a shadow or elastic rule, without checking its MAC; ok is false for
// any other ID.
func splitLeaseID(id string) (p leaseIDParts, body, mac string, ok bool) {
	i := strings.LastIndex(id, leaseIDSep)
	if i < 0 {
		return p, "", "", false
	}
	body, mac = id[:i], id[i+len(leaseIDSep):]
	parts := strings.Split(body, leaseIDSep)
	switch len(parts) {
	case 2, 4:
	default:
		return p, "", "", false
	}
	p.storeID = parts[0]
	var nums [3]int64
	for i, s := range parts[1:] {
		n, err := strconv.ParseInt(s, 36, 64)
		if err != nil || n < 0 || strconv.FormatInt(n, 36) != s {
			// Only what format writes: no sign, no leading zero, lower
			// case (FuzzParseLeaseID).
			return leaseIDParts{}, "", "", false
		}
		nums[i] = n
	}
	p.own, p.borrowed, p.stamp, p.elastic = nums[0], nums[1], nums[2], len(parts) == 4
	return p, body, mac, true
}

// parseLeaseID returns what id remembers when it is the ID of a shadow or
// elastic rule's lease of key that an engine gave client, its MAC under
// secret; ok is false for any other ID, a forged or altered one included.
func parseLeaseID(secret []byte, client, key, id string) (leaseIDParts, bool) {
	p, body, mac, ok := splitLeaseID(id)
	if !ok {
		return leaseIDParts{}, false
	}
	// Strict: the MAC's last character carries 4 bits and 2 of padding,
	// which the lax decoder ignores, so that four spellings of one ID
	// verified (FuzzParseLeaseID).
	got, err := base64.RawURLEncoding.Strict().DecodeString(mac)
	if err != nil || !hmac.Equal(got, idMAC(secret, client, key, []byte(body))) {
		return leaseIDParts{}, false
	}
	return p, true
}

// SettlesLease reports whether a lease entry with lease ID id can settle a
// lease the store keeps: false for the ID of a shadow or elastic rule's
// lease whose limits granted nothing (its settle is a new request when it
// wants tokens), true for any other, including IDs the store will not
// know. A server that caps a client's keys counts an entry that settles
// nothing as a new request (a forged "x~0" was once let through as a
// settle).
func SettlesLease(id string) bool {
	p, _, _, ok := splitLeaseID(id)
	return !ok || p.own > 0
}
