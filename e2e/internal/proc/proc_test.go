package proc

import (
	"runtime"
	"strings"
	"sync"
	"testing"
)

func TestTailKeepsTheEnd(t *testing.T) {
	b := NewTail(100)
	if got := b.String(); got != "" {
		t.Fatalf("empty Tail holds %q", got)
	}
	if _, err := b.Write([]byte("hello ")); err != nil {
		t.Fatal(err)
	}
	if got := b.String(); got != "hello " {
		t.Fatalf("String = %q", got)
	}
	for range 100 {
		if n, err := b.Write([]byte("0123456789")); n != 10 || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	_, _ = b.Write([]byte("end"))
	got := b.String()
	if len(got) < 50 || len(got) > 100 {
		t.Fatalf("holds %d bytes, want 50..100", len(got))
	}
	if !strings.HasSuffix(got, "0123456789end") {
		t.Fatalf("does not end with the last writes: %q", got)
	}
	if last := b.Last(5); last != "89end" {
		t.Fatalf("Last(5) = %q", last)
	}
	if last := b.Last(1000); last != got {
		t.Fatalf("Last(1000) = %q, want all of %q", last, got)
	}
	// One write larger than the bound keeps its own end.
	_, _ = b.Write([]byte(strings.Repeat("x", 300) + "!"))
	if got := b.String(); len(got) != 50 || !strings.HasSuffix(got, "x!") {
		t.Fatalf("after a large write: %d bytes, %q", len(got), got)
	}
}

func TestTailConcurrent(t *testing.T) {
	b := NewTail(1 << 10)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 1000 {
				_, _ = b.Write([]byte("line\n"))
			}
		})
		wg.Go(func() {
			for range 1000 {
				if s := b.String(); len(s) > 1<<10 {
					t.Errorf("holds %d bytes", len(s))
					return
				}
				_ = b.Last(10)
			}
		})
	}
	wg.Wait()
	if s := b.String(); len(s) < 1<<9 {
		t.Fatalf("holds %d bytes, want at least %d", len(s), 1<<9)
	}
}

func TestSysProcAttr(t *testing.T) {
	a := SysProcAttr()
	if runtime.GOOS == "linux" && a == nil {
		t.Fatal("no process attributes on Linux")
	}
}
