package leases

import (
	"strconv"
	"strings"
	"testing"

	"github.com/ratelease/ratelease/protocol"
)

// FuzzParseLeaseID feeds arbitrary lease IDs, as a client sends them back
// in a settle, to the parsing of the IDs of shadow and elastic rules. It
// must never panic; splitLeaseID must give counts that are never negative
// and a store ID without the separator; parseLeaseID, which checks the
// MAC, must take only what format writes, byte for byte. And every ID
// format writes fits a lease_id, parses back to its parts for its client
// and key, and for no other client or key, nor once any one byte of it is
// changed.
func FuzzParseLeaseID(f *testing.F) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	for _, s := range []string{
		"", "~", "~~~", "abc", "8000000000000001", "8000000000000001~0", "8000000000000001~5~AAAAAAAAAAA",
		"8000000000000001~5~3~1764000000000~AAAAAAAAAAA", "8000000000000001~0~3~k~AAAAAAAAAAA",
		"8000000000000001~-1~AAAAAAAAAAA", "8000000000000001~+5~AAAAAAAAAAA", "8000000000000001~05~AAAAAAAAAAA",
		"8000000000000001~-0~AAAAAAAAAAA", "8000000000000001~A~AAAAAAAAAAA", "~5~AAAAAAAAAAA", "a~b~c~d~e~f",
		"8000000000000001~1y2p0ij32e8e7~AAAAAAAAAAA", "8000000000000001~1y2p0ij32e8e8~AAAAAAAAAAA",
	} {
		f.Add(s, int64(0), int64(0), int64(0), uint8(0))
	}
	f.Fuzz(func(t *testing.T, id string, own, borrowed, stamp int64, at uint8) {
		_ = SettlesLease(id)
		if p, body, _, ok := splitLeaseID(id); ok {
			if p.own < 0 || p.borrowed < 0 || p.stamp < 0 {
				t.Fatalf("splitLeaseID(%q) = %+v", id, p)
			}
			if strings.Contains(p.storeID, leaseIDSep) || !strings.HasPrefix(id, body) {
				t.Fatalf("splitLeaseID(%q) = %+v, body %q", id, p, body)
			}
		}
		if p, ok := parseLeaseID(secret, "c", "k", id); ok {
			if again := p.format(secret, "c", "k"); again != id {
				t.Fatalf("parseLeaseID(%q) = %+v, which format writes %q", id, p, again)
			}
		}

		// What format writes, from counts up to their protocol maximum.
		p := leaseIDParts{storeID: strconv.FormatUint(uint64(stamp)|1<<63, 16), own: abs(own) % (protocol.MaxCount + 1), borrowed: abs(borrowed) % (protocol.MaxCount + 1), stamp: abs(stamp), elastic: borrowed != 0}
		if !p.elastic {
			p.borrowed, p.stamp = 0, 0
		}
		w := p.format(secret, "c", "k")
		if len(w) > protocol.MaxLeaseIDBytes {
			t.Fatalf("%+v is written %q, %d bytes", p, w, len(w))
		}
		if got, ok := parseLeaseID(secret, "c", "k", w); !ok || got != p {
			t.Fatalf("%q parses as %+v, %v; want %+v", w, got, ok, p)
		}
		if SettlesLease(w) != (p.own > 0) {
			t.Fatalf("SettlesLease(%q) = %v", w, !(p.own > 0))
		}
		for _, o := range [][2]string{{"c2", "k"}, {"c", "k2"}, {"k", "c"}} {
			if _, ok := parseLeaseID(secret, o[0], o[1], w); ok {
				t.Fatalf("%q verifies for client %q and key %q", w, o[0], o[1])
			}
		}
		i := int(at) % len(w)
		for _, c := range []byte{'0', 'A', '~', 'z'} {
			if c == w[i] {
				continue
			}
			changed := w[:i] + string(c) + w[i+1:]
			if got, ok := parseLeaseID(secret, "c", "k", changed); ok {
				t.Fatalf("%q, %q changed at %d, verifies as %+v", w, changed, i, got)
			}
		}
	})
}

// abs returns |n|, and 0 for the most negative n.
func abs(n int64) int64 {
	if n < 0 {
		if n == -n {
			return 0
		}
		return -n
	}
	return n
}
