package leases_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ratelease/ratelease/leases"
)

// An Engine over the memory store: lease a batch, then settle it and take
// the next one in the same call.
func ExampleEngine() {
	policy, err := leases.NewPolicy(leases.RuleSet{
		Default: leases.DefaultDeny,
		Rules:   []leases.Rule{{Name: "per-user", Match: "user:*", Limit: 100, Period: time.Second}},
	})
	if err != nil {
		panic(err)
	}
	store := leases.NewMemoryStore(leases.MemoryOptions{})
	defer store.Close()
	engine := leases.NewEngine(leases.EngineOptions{Store: store, Policy: policy})
	ctx := context.Background()
	// The authenticated client "checkout", process 7f3a.
	owner := leases.Owner{Client: "checkout", Process: "7f3a"}

	res, _, err := engine.Lease(ctx, owner, []leases.LeaseAsk{{Key: "user:42", Want: 30}})
	if err != nil {
		panic(err)
	}
	first := res[0]
	fmt.Println("granted", first.Granted, "remaining", first.Remaining, "rule", first.Rule.Name)

	// 12 of the 30 were used: 18 go back, and a new batch of 30 is taken.
	res, _, err = engine.Lease(ctx, owner, []leases.LeaseAsk{{Key: "user:42", Want: 30, LeaseID: first.LeaseID, Used: 12}})
	if err != nil {
		panic(err)
	}
	fmt.Println("granted", res[0].Granted, "remaining", res[0].Remaining)

	res, _, _ = engine.Lease(ctx, owner, []leases.LeaseAsk{{Key: "svc:other", Want: 1}})
	fmt.Println(errors.Is(res[0].Err, leases.ErrNoRule), res[0].Err)
	// Output:
	// granted 30 remaining 70 rule per-user
	// granted 30 remaining 58
	// true key "svc:other" matches no rule and the server's default is deny
}

// Policy.Match picks the most specific rule.
func ExamplePolicy_Match() {
	policy, err := leases.NewPolicy(leases.RuleSet{Rules: []leases.Rule{
		{Name: "users", Match: "user:*", Limit: 100, Period: time.Second},
		{Name: "user-42", Match: "user:42", Limit: 5, Period: time.Second},
	}})
	if err != nil {
		panic(err)
	}
	for _, key := range []string{"user:42", "user:7", "api:x"} {
		if r, ok := policy.Match(key); ok {
			fmt.Println(key, "->", r.Name)
		} else {
			fmt.Println(key, "-> no rule, default", policy.Default())
		}
	}
	// Output:
	// user:42 -> user-42
	// user:7 -> users
	// api:x -> no rule, default allow
}
