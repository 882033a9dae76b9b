package keytemplate_test

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/ratelease/ratelease/client/keytemplate"
	"github.com/ratelease/ratelease/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	kindIP uint8 = iota + 1
	kindUser
	kindMD
)

func resolve(name string) (keytemplate.Segment, error) {
	switch name {
	case "ip":
		return keytemplate.Segment{Kind: kindIP, Raw: true}, nil
	case "user":
		return keytemplate.Segment{Kind: kindUser}, nil
	}
	if md, ok := strings.CutPrefix(name, "md:"); ok && md != "" {
		return keytemplate.Segment{Kind: kindMD, Text: strings.ToLower(md)}, nil
	}
	return keytemplate.Segment{}, fmt.Errorf("unknown part {%s}", name)
}

func TestParseAndExpand(t *testing.T) {
	tm, err := keytemplate.Parse("u:{user}|ip:{ip}|k:{md:X-Key}", resolve)
	require.NoError(t, err)
	assert.Equal(t, 3, tm.Parts())
	assert.Equal(t, "u:{user}|ip:{ip}|k:{md:X-Key}", tm.String())
	vals := map[uint8]string{kindUser: "a|b:c", kindIP: "2001:db8::/64", kindMD: "x-key"}
	k, err := tm.Expand(func(s keytemplate.Segment) (string, bool) {
		if s.Kind == kindMD {
			assert.Equal(t, "x-key", s.Text)
		}
		return vals[s.Kind], true
	})
	require.NoError(t, err)
	assert.Equal(t, "u:a%7Cb%3Ac|ip:2001:db8::/64|k:x-key", k, "raw {ip} kept, the user escaped")

	_, err = tm.Expand(func(s keytemplate.Segment) (string, bool) { return "", s.Kind != kindUser })
	var mp *keytemplate.MissingPartError
	require.True(t, errors.As(err, &mp))
	assert.Equal(t, "{user}", mp.Segment.Written)

	long := strings.Repeat("x", 300)
	k, err = tm.Expand(func(s keytemplate.Segment) (string, bool) {
		if s.Kind == kindIP {
			return "192.0.2.1", true
		}
		return long, true
	})
	require.NoError(t, err)
	require.NoError(t, protocol.ValidateKey(k))
	assert.Contains(t, k, keytemplate.HashPart(long))
}

func TestParseErrors(t *testing.T) {
	for _, src := range []string{"", "{nope}", "a{", "}", "{user}{ip}", "{user}:{ip}", "{user}x{md:k}", "100%:{user}", "x\x01:{user}"} {
		_, err := keytemplate.Parse(src, resolve)
		assert.Error(t, err, "%q", src)
	}
	for _, src := range []string{"{user}:{md:k}", "{user}|{ip}", "static"} {
		_, err := keytemplate.Parse(src, resolve)
		assert.NoError(t, err, "%q", src)
	}
}

func TestClientAddr(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	peer := netip.MustParseAddr("10.0.0.1")
	xff := keytemplate.SplitXForwardedFor([]string{"203.0.113.9, 198.51.100.7", "10.1.1.1"})
	assert.Equal(t, netip.MustParseAddr("198.51.100.7"), keytemplate.ClientAddr(peer, xff, trusted), "right-most untrusted")
	untrusted := netip.MustParseAddr("192.0.2.1")
	assert.Equal(t, untrusted, keytemplate.ClientAddr(untrusted, xff, trusted), "an untrusted peer's header is ignored")
	assert.Equal(t, netip.MustParseAddr("10.1.1.1"), keytemplate.ClientAddr(peer, []string{"garbage", "10.1.1.1"}, trusted))
	a, ok := keytemplate.ParsePeer("[::ffff:192.0.2.1]:80")
	require.True(t, ok)
	assert.Equal(t, "192.0.2.1", keytemplate.IPPart(a, 32, 64))
	a, _ = keytemplate.ParsePeer("[2001:db8::1%eth0]:80")
	assert.Equal(t, "2001:db8::/64", keytemplate.IPPart(a, 32, 64))
	assert.Equal(t, netip.MustParsePrefix("10.0.0.0/8"), keytemplate.NormalizePrefix(netip.MustParsePrefix("::ffff:10.0.0.0/104")))
}
