package listen

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

func TestLoopbackAddressesAreServedOnBothLoopbacks(t *testing.T) {
	tests := []struct {
		addr string
		want []string
	}{
		{"127.0.0.1:9100", []string{"127.0.0.1:9100", "[::1]:9100"}},
		{"localhost:9100", []string{"127.0.0.1:9100", "[::1]:9100"}},
		{"[::1]:9100", []string{"127.0.0.1:9100", "[::1]:9100"}},
		{"10.0.0.5:9100", []string{"10.0.0.5:9100"}},
		{":9100", []string{":9100"}},
	}
	for _, tt := range tests {
		got, err := Addresses(tt.addr)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("Addresses(%q) = %v, %v; want %v", tt.addr, got, err, tt.want)
		}
	}
	if _, err := Addresses("9100"); err == nil {
		t.Error("an address without a port is taken")
	}
}

// A port another process holds when the agent starts is the agent's as soon as that process lets it go: the agent
// waits for it, never exits.
func TestHeldAddressIsTakenOnceItsHolderLetsGo(t *testing.T) {
	Retry = 20 * time.Millisecond
	holder, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := holder.Addr().String()
	got := make(chan net.Listener, 1)
	go func() { got <- WhenFree(context.Background(), addr, "the test's port", logr.Discard()) }()
	select {
	case ln := <-got:
		t.Fatalf("listened on %v while another holds it", ln)
	case <-time.After(100 * time.Millisecond):
	}
	holder.Close()
	select {
	case ln := <-got:
		if ln == nil || ln.Addr().String() != addr {
			t.Fatalf("got %v, want a listener on %s", ln, addr)
		}
		ln.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the freed address was not taken")
	}

	holder, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { got <- WhenFree(ctx, addr, "the test's port", logr.Discard()) }()
	cancel()
	if ln := <-got; ln != nil {
		t.Errorf("a listener after ctx ended: %v", ln)
	}
}
