package client

import (
	"fmt"
	"os"

	"github.com/ratelease/ratelease/protocol"
)

func init() {
	if os.Getenv("DBG") != "" {
		debugApply = func(id string, p pending, r *protocol.LeaseResult) {
			if id == os.Getenv("DBG") {
				fmt.Printf("%s slot=%d want=%d settle=%v used=%d -> granted=%d retry=%d err=%v rem=%d\n", id, p.slot, p.want, p.settling != nil, p.used, r.Granted, r.RetryAfterMillis, r.Error, r.Remaining)
			}
		}
	}
}
