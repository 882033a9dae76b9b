package e2e

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// blackhole is a TCP proxy on 127.0.0.1 between one client and one lease
// server that can be cut: after Cut it forwards nothing in either
// direction, but keeps every connection open, and accepts new connections
// without ever answering them. To the client the server is then neither
// down nor refusing: its calls hang until they time out, as when a network
// partition drops packets.
//
// The proxy forwards whole HTTP/1.1 messages (it reads each request and
// response to its end, then writes its bytes unchanged), so a cut never
// delivers half a message, and it records every response it forwarded,
// with the time its request arrived, for the test to read.
type blackhole struct {
	t      testing.TB
	ln     net.Listener
	target string
	cut    atomic.Bool

	mu        sync.Mutex
	conns     map[net.Conn]bool
	exchanges []exchange
	dropped   int // requests read after the cut (or while it was in force)
	closed    bool

	wg sync.WaitGroup
}

// exchange is one request and response the proxy forwarded.
type exchange struct {
	requestAt time.Time // when the proxy had read the whole request
	respondAt time.Time // when it had written the whole response
	status    int
	body      []byte // the response body, decoded from any chunking
}

// startBlackhole starts a proxy to target ("127.0.0.1:port"); it stops at
// the end of the test.
func startBlackhole(t testing.TB, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &blackhole{t: t, ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// URL returns the proxy's base URL.
func (p *blackhole) URL() string { return "http://" + p.ln.Addr().String() }

// Cut stops all forwarding, for good.
func (p *blackhole) Cut() { p.cut.Store(true) }

// Exchanges returns the request and response pairs forwarded so far.
func (p *blackhole) Exchanges() []exchange {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]exchange(nil), p.exchanges...)
}

// Dropped returns the number of requests the proxy read and did not
// forward because it was cut.
func (p *blackhole) Dropped() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// track registers c to be closed by close; it reports false (and closes
// c) when the proxy is already closed.
func (p *blackhole) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = true
	return true
}

func (p *blackhole) untrack(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *blackhole) close() {
	p.mu.Lock()
	p.closed = true
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *blackhole) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		if !p.track(client) {
			return
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

// serve proxies one client connection. While cut, it never dials the
// server: the client's requests are read and dropped.
func (p *blackhole) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	var server net.Conn
	if !p.cut.Load() {
		var err error
		if server, err = net.DialTimeout("tcp", p.target, 2*time.Second); err != nil {
			p.t.Logf("blackhole: dial %s: %v", p.target, err)
			return
		}
		if !p.track(server) {
			return
		}
		defer p.untrack(server)
	}
	// requestAt is the arrival of the latest request on this connection:
	// HTTP/1.1 without pipelining, so it is the request of the next
	// response.
	var requestAt atomic.Int64
	if server != nil {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			pipe(server, readResponse, func(raw, body []byte, status int) bool {
				if p.cut.Load() {
					return false
				}
				if _, err := client.Write(raw); err != nil {
					return false
				}
				p.mu.Lock()
				p.exchanges = append(p.exchanges, exchange{
					requestAt: time.Unix(0, requestAt.Load()), respondAt: time.Now(),
					status: status, body: body,
				})
				p.mu.Unlock()
				return true
			})
			if !p.cut.Load() {
				// The server closed the connection: so does the proxy. A
				// cut proxy keeps the client's side open, whatever the
				// server does.
				client.Close()
			}
		}()
	}
	pipe(client, readRequest, func(raw, _ []byte, _ int) bool {
		if server == nil || p.cut.Load() {
			p.mu.Lock()
			p.dropped++
			p.mu.Unlock()
			return true
		}
		requestAt.Store(time.Now().UnixNano())
		_, err := server.Write(raw)
		return err == nil
	})
}

// message reads one HTTP message from br and returns its body and status
// (0 for a request).
type message func(br *bufio.Reader) (body []byte, status int, err error)

func readRequest(br *bufio.Reader) ([]byte, int, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, 0, err
	}
	defer req.Body.Close()
	body, err := io.ReadAll(req.Body)
	return body, 0, err
}

func readResponse(br *bufio.Reader) ([]byte, int, error) {
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return body, resp.StatusCode, err
}

// pipe reads whole messages from src and hands each one's raw bytes (as
// they came, headers and framing included) to forward, until src ends
// (closed, or not HTTP) or forward returns false. A message is never handed
// over before its last byte has arrived.
func pipe(src net.Conn, read message, forward func(raw, body []byte, status int) bool) {
	var raw bytes.Buffer // bytes read from src and not yet handed over
	br := bufio.NewReader(io.TeeReader(src, &raw))
	for {
		body, status, err := read(br)
		if err != nil {
			return
		}
		// raw holds what br consumed plus what it buffered ahead: the
		// message is the consumed part.
		msg := raw.Next(raw.Len() - br.Buffered())
		if !forward(msg, body, status) {
			// Cut (or the peer is gone): keep reading until src closes,
			// so that its sender sees a peer that never answers.
			_, _ = io.Copy(io.Discard, src)
			return
		}
	}
}
