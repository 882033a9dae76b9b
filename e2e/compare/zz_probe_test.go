package compare

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelease/ratelease/client"
)

type logRT struct{ start time.Time; allowed *atomic.Int64 }

func (l logRT) RoundTrip(r *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil {
		rb, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(bytes.NewReader(rb))
		fmt.Printf("t=%6.3f allowed=%d\n  req %s\n  resp %.300s\n", time.Since(l.start).Seconds(), l.allowed.Load(), body, rb)
	}
	return resp, err
}

func BenchmarkZZProbe(b *testing.B) {
	e := startEnv(b)
	wl := makeWorkloads("p")[0]
	var allowed, denied atomic.Int64
	start := time.Now()
	c, _ := client.New(client.Config{Servers: []string{e.daemon.URL()}, InitialBatch: 1_000_000, MaxBatch: 1_000_000_000,
		HTTPClient: &http.Client{Transport: logRT{start, &allowed}}})
	defer c.Close(context.Background())
	ctx := context.Background()
	key := wl.keys[0]
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				for range 1000 {
					if c.Allow(ctx, key).Allowed {
						allowed.Add(1)
					} else {
						denied.Add(1)
					}
				}
			}
		})
	}
	time.Sleep(4 * time.Second)
	close(stop)
	wg.Wait()
	fmt.Println("allowed", allowed.Load(), "denied", denied.Load())
}
