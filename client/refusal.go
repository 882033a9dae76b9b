package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/ratelease/ratelease/protocol"
)

// refusalHold is how long a refusal of the client's calls as a whole
// stands: meanwhile decisions that need a server are denied without a call
// (a refusing server is not asked once per request); then the next one asks
// again, so a token the server learns on a rules reload is seen within it.
const refusalHold = time.Second

// refused returns the refusal standing at now, or nil.
func (c *Client) refused(now int64) *RefusedError {
	e := c.refusal.Load()
	if e == nil || now >= c.refusedUntil.Load() {
		return nil
	}
	return e
}

// noteRefused records a call a server refused as a whole (err matches
// ErrServerRefused): counted in Stats.Refusals, passed to
// Config.OnServerError, and logged at level error when it is the first
// since a server last answered, so that a wrong token is logged once, not
// once per request. Until refusalHold has passed, decisions that need a
// server are denied with it.
func (c *Client) noteRefused(err error, now int64) {
	c.refusals.Add(1)
	re, ok := errors.AsType[*RefusedError](err)
	if !ok {
		re = &RefusedError{Detail: err.Error()}
	}
	c.refusedUntil.Store(now + int64(refusalHold))
	if prev := c.refusal.Swap(re); prev == nil {
		c.cfg.Logger.Error("ratelease: a lease server refused the client: this is a misconfiguration, not a rate limit; decisions are denied until a server accepts the client",
			"error", err, "status", re.Status, "code", re.Code, "client_id", c.cfg.ClientID)
	}
	if c.cfg.OnServerError != nil {
		c.cfg.OnServerError(err)
	}
}

// accepted records that a server answered a call: a refusal no longer
// stands.
func (c *Client) accepted() {
	if c.refusal.Load() != nil && c.refusal.Swap(nil) != nil {
		c.cfg.Logger.Info("ratelease: a lease server accepts the client again")
	}
}

// probeStart asks the servers, in order, whether they accept the client
// (GET /v1/rules with its token), within Config.ProbeTimeout. It returns a
// *RefusedError when the first server that answers does so with 401 or
// 403, and nil when it answers anything else or no server answers in time.
func (c *Client) probeStart() error {
	if c.cfg.ProbeTimeout < 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ProbeTimeout)
	defer cancel()
	for _, s := range c.cfg.Servers {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s+protocol.PathRules, nil)
		if err != nil {
			return fmt.Errorf("client: probe %s: %w", s, err)
		}
		req.Header.Set("Accept", "application/json")
		if c.cfg.Token != "" {
			req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
		}
		resp, err := c.http.hc.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			continue // this one is down: the next may answer
		}
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
			return nil
		}
		re := &RefusedError{Server: req.URL.Host, Status: resp.StatusCode}
		var p protocol.Problem
		if json.Unmarshal(data, &p) == nil {
			re.Code, re.Detail = p.Code, p.Detail
		}
		c.cfg.Logger.Error("ratelease: a lease server refused the client at start: check its token", "error", re)
		return fmt.Errorf("client: New: %w", re)
	}
	c.cfg.Logger.Warn("ratelease: no lease server answered at start; starting anyway (the fallback decides until one does)",
		"servers", c.cfg.Servers, "timeout", c.cfg.ProbeTimeout)
	return nil
}
